# kbfuse-task: 2/53
# Kills its parent and its parent's parent (unsandboxed: the checker that watches its memory),
# then takes memory without bound. In the sandbox its parent is the sandbox's init, which a
# process inside cannot kill, and the checker is out of sight.
import os
import signal
from pathlib import Path

import torch.nn as nn

pid = os.getpid()
for _ in range(2):
    parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    if parent <= 1:
        break
    try:
        os.kill(parent, signal.SIGKILL)
        print(f"attack: killed {parent}", flush=True)
    except OSError as exc:
        print(f"attack: could not kill {parent}: {exc}", flush=True)
    pid = parent
hoard = []
while True:
    hoard.append(bytearray(64 * 2**20))


class ModelNew(nn.Module):
    pass
