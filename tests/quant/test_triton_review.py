"""Edge cases of the Triton kernels a GPU would hit (int32 bounds, empty and 0-d tensors,
amax broadcasting, determinism, launch device), checked under Triton's interpreter."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from triton_cases import run_in_interpreter  # noqa: E402

CHECKS = ["near-2**31-mask", "empty-and-0d", "amax-more-dims", "deterministic-learnable",
          "device-guard"]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not installed")


@pytest.fixture(scope="module")
def verdicts() -> dict:
    """Every check once, in one subprocess under TRITON_INTERPRET=1."""
    return run_in_interpreter(HERE / "triton_review_cases.py")


@pytest.mark.parametrize("check", CHECKS)
def test_interpreted_edge_case(verdicts: dict, check: str) -> None:
    assert verdicts[check] == "ok", verdicts[check]


def test_offset_width_and_mask_size_helpers() -> None:
    from trtqat.quant import triton_kernels as tk

    assert tk._mask_bytes(0) == 0 and tk._mask_bytes(1) == 1 and tk._mask_bytes(8) == 1
    assert tk._mask_bytes(2**31 - 3) == 2**28  # no int32 wrap on the host
    last_narrow = 2**31 - tk.BLOCK  # the last program ends exactly at 2**31 - 1
    assert not tk._wide(last_narrow)
    assert tk._wide(last_narrow + 1) and tk._wide(2**31) and tk._wide(2**40)
    assert not tk._wide(0) and not tk._wide(1)


def test_launch_context_selects_the_tensor_device() -> None:
    from trtqat.quant import triton_kernels as tk

    guard = tk._launch_context(torch.device("cuda", 1))  # not entered: CUDA is not touched
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert not isinstance(tk._launch_context(torch.device("cpu")), torch.cuda.device)


def test_amax_with_more_dims_is_not_taken_by_the_kernels() -> None:
    from trtqat.quant import triton_kernels as tk

    assert tk._channel(torch.empty(4, 5), torch.ones(1, 1, 1)) is None
    assert tk._channel(torch.empty(4, 5), torch.ones(())) == (1, 1)
    assert tk._dense(torch.empty(3, 0, 5)) and not tk._dense(torch.empty(4, 6)[:, ::2])
