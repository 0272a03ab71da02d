"""Picks the fastest available fake-quant kernels (compiled if built, else pure PyTorch)."""

from __future__ import annotations

from trtqat.quant._fused import (  # noqa: F401
    BACKEND,
    fake_quant_forward,
    fake_quant_grad_input,
    scale_of,
)
