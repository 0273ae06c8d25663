"""Mixed precision for forward passes, shared by training steps and evaluation."""

from __future__ import annotations

import contextlib

import torch


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Mixed precision on CUDA only; CPU runs (tests, the demo) stay fp32 and reproducible."""
    if device.type != "cuda" or precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast("cuda", dtype=dtype)
