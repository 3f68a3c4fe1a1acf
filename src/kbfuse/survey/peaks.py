"""Peak arithmetic rates by GPU name, for the survey's "how well does the library call do".

Dense (no structured sparsity) peaks from NVIDIA's data sheets, in TFLOP/s, at boost clock:
`fp32` is the CUDA-core FP32 rate (what a strict-FP32 GEMM or convolution can reach at most),
`tf32` the tensor-core TF32 rate (what it can reach when TF32 is allowed for that op). The data
sheets print TF32 "with sparsity"; the dense figure is half of it.

| GPU (device name as torch reports it) | fp32 | tf32 dense | data sheet |
|---|---|---|---|
| NVIDIA H200 (SXM) | 67 | 494.7 | H200 Tensor Core GPU |
| NVIDIA H200 NVL | 60 | 417.5 | H200 Tensor Core GPU |
| NVIDIA H100 80GB HBM3 (SXM) | 67 | 494.7 | H100 Tensor Core GPU |
| NVIDIA H100 PCIe | 51 | 378 | H100 Tensor Core GPU |
| NVIDIA H100 NVL | 60 | 417.5 | H100 Tensor Core GPU |
| NVIDIA A100 (SXM4 and PCIe) | 19.5 | 156 | A100 Tensor Core GPU |
| NVIDIA L40S | 91.6 | 183 | L40S GPU |

A device name matching no row has no peak: the survey leaves the column blank and says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    gpu: str
    fp32_tflops: float
    tf32_tflops: float


# (pattern on the device name, peak): first match wins, so NVL rows come before SXM rows.
PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"H200 NVL", Peak("H200 NVL", 60.0, 417.5)),
    (r"H200", Peak("H200 SXM", 67.0, 494.7)),
    (r"H100 NVL", Peak("H100 NVL", 60.0, 417.5)),
    (r"H100 PCIe", Peak("H100 PCIe", 51.0, 378.0)),
    (r"H100", Peak("H100 SXM", 67.0, 494.7)),
    (r"A100", Peak("A100", 19.5, 156.0)),
    (r"L40S", Peak("L40S", 91.6, 183.0)),
)


def peak_for(device_name: str | None) -> Peak | None:
    """The peak of a device by its name, or None when the table has no row for it."""
    for pattern, peak in PEAKS:
        if device_name and re.search(pattern, device_name):
            return peak
    return None


def uses_tf32(main_op: str | None, matmul_tf32: bool, cudnn_tf32: bool) -> bool:
    """Whether the main op may run on TF32 tensor cores under the record's numerics flags:
    convolutions follow cuDNN's flag, every other main op (GEMMs) the matmul flag."""
    if not main_op:
        return False
    return cudnn_tf32 if "conv" in main_op else matmul_tf32
