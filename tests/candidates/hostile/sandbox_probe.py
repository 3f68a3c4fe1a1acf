# kbfuse-task: 2/53
# Reports what it can reach and stops: its import fails with a message of name=value facts,
# which the verdict's failure message carries.
import os
import socket
from pathlib import Path

facts = {"uid": os.getuid(), "pid": os.getpid()}
facts["processes"] = len([p for p in os.listdir("/proc") if p.isdigit()])
facts["sibling_reference"] = (Path.cwd().parent / "reference").exists()
facts["target_visible"] = Path(os.environ.get("KBFUSE_ATTACK_TARGET", "/nonexistent")).exists()
for name, path in (("root", "/kbfuse-attack"), ("usr", "/usr/kbfuse-attack")):
    try:
        Path(path).write_text("x")
        facts[f"write_{name}"] = True
    except OSError:
        facts[f"write_{name}"] = False
try:
    socket.create_connection(("127.0.0.1", int(os.environ.get("KBFUSE_ATTACK_PORT", "9"))), 2)
    facts["network"] = True
except OSError:
    facts["network"] = False
facts["home"] = os.environ.get("HOME", "")
facts["secret"] = os.environ.get("SECRET_TOKEN", "-")
raise RuntimeError("probe " + " ".join(f"{k}={v}" for k, v in facts.items()))
