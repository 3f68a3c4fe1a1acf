# kbfuse-task: 2/53
# Leaves a process of its own session behind (setsid) that takes the GPU lock (its file in
# KBFUSE_ATTACK_TARGET) alone and keeps it for a minute: no other job could use the device.
import os
import subprocess
import sys

import torch.nn as nn

HOLDER = """
import fcntl, sys, time
for _ in range(40):
    try:
        lock = open(sys.argv[1], "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
        print("attack: holding the GPU lock", flush=True)
        time.sleep(60)
        break
    except OSError:
        time.sleep(0.25)
"""
subprocess.Popen(
    [sys.executable, "-c", HOLDER, os.environ["KBFUSE_ATTACK_TARGET"], "kbfuse-attack-holder"],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
