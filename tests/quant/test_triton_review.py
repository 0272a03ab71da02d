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
    import triton

    for n in (0, 1, tk.BLOCK - 1, tk.BLOCK, tk.BLOCK + 1, last_narrow, last_narrow + 1, 2**40 + 3):
        assert tk._grid(n) == (triton.cdiv(n, tk.BLOCK),)  # plain arithmetic, same programs


def test_dense_and_same_layout_fast_paths_agree_with_the_general_rule() -> None:
    from trtqat.quant import triton_kernels as tk

    x = torch.empty(2, 3, 4, 5)
    for t, dense in ((x, True), (x.contiguous(memory_format=torch.channels_last), True),
                     (x.permute(3, 1, 0, 2), True), (x[:, :, ::2], False), (x[:, 1:], False),
                     (torch.empty(3, 1, 4).transpose(0, 1), True), (torch.empty(0, 3), True)):
        assert tk._dense(t) is dense, (t.shape, t.stride())
    cl = x.contiguous(memory_format=torch.channels_last)
    assert tk._same_layout(cl, torch.empty_like(cl)) and not tk._same_layout(cl, x)
    assert tk._same_layout(torch.empty(3, 1), torch.empty(3, 1).t().t())
    assert tk._same_layout(torch.empty(1, 3), torch.empty(3, 1).t())  # size-1 strides ignored


def test_launch_context_selects_the_tensor_device(monkeypatch) -> None:
    from trtqat.quant import triton_kernels as tk

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # no GPU needed
    guard = tk._launch_context(torch.device("cuda", 1))  # not entered: CUDA is not touched
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    # the tensor's device already current: no switch (it costs host time every launch)
    assert not isinstance(tk._launch_context(torch.device("cuda", 0)), torch.cuda.device)
    assert not isinstance(tk._launch_context(torch.device("cpu")), torch.cuda.device)


def test_amax_with_more_dims_is_not_taken_by_the_kernels() -> None:
    from trtqat.quant import triton_kernels as tk

    assert tk._channel(torch.empty(4, 5), torch.ones(1, 1, 1)) is None
    assert tk._channel(torch.empty(4, 5), torch.ones(())) == (1, 1)
    assert tk._dense(torch.empty(3, 0, 5)) and not tk._dense(torch.empty(4, 6)[:, ::2])
