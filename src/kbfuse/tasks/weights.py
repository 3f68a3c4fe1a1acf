"""A fingerprint of a model's weights, so a record names the weights it was computed with.

The study builds a fresh model for every correctness seed (so every seed has its own weights);
records carry the sha256 of each model's state (parameters and buffers, by name, with shape
and dtype), which shows that the weights really differed and lets two runs be compared.
"""

from __future__ import annotations

import hashlib


def weights_sha256(model) -> str:
    """sha256 over the model's state_dict: each entry's name, shape, dtype and raw bytes."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        value = tensor.detach().contiguous().cpu()
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
