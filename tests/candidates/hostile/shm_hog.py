# kbfuse-task: 2/53
# Writes 3 GiB to /dev/shm (memory no resident-set limit counts) and stops at the first
# refusal, naming how far it got.
import os

import torch.nn as nn

chunk, written = b"\1" * (64 * 2**20), 0
try:
    with open(f"/dev/shm/kbfuse-attack-{os.getpid()}", "wb") as hog:
        while written < 3 * 2**30:
            hog.write(chunk)
            hog.flush()
            written += len(chunk)
except OSError as exc:
    raise OSError(f"/dev/shm refused after {written >> 20} MiB: {exc.strerror}") from None
raise RuntimeError(f"/dev/shm took all {written >> 20} MiB")


class ModelNew(nn.Module):
    pass
