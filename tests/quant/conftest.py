"""Fixtures shared by the quantizer tests."""

from __future__ import annotations

import pytest

from trtqat.quant import _kernels


@pytest.fixture(params=["fastest", "pytorch"])
def backend(request):
    """Each test runs with the fastest kernels here and with the pure-PyTorch ones."""
    before = _kernels._forced or None
    _kernels.set_backend(None if request.param == "fastest" else "pytorch")
    yield request.param
    _kernels.set_backend(before)
