"""The fp32 export tolerance: 1e-4 of the output's scale, or 4x PyTorch's own float32 error
(the model rerun in float64) where float32 rounding alone goes further; a real export bug
(a perturbed weight in the file) still fails."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from trtqat.export import criterion as crit
from trtqat.export import export_onnx
from trtqat.export.validate import REL_TOL, compare, ort_session, run_ort

pytestmark = pytest.mark.usefixtures("one_thread")


class Cancelling(torch.nn.Module):
    """Hidden units near 1000 summed by zero-mean weights into logits near 1: float32
    rounding of the large partial sums leaves ~3e-4 of the output's scale (as deep models
    with large logits do, e.g. efficientnet_v2_s), with no export bug."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(16, 256), torch.nn.Linear(256, 10)
        with torch.no_grad():
            self.a.bias.fill_(1000.0)
            self.b.weight.sub_(self.b.weight.mean(1, keepdim=True))
            self.b.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_fp32_tolerance_grows_to_pytorchs_own_float32_error(tmp_path):
    model, x = Cancelling().eval(), torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x).numpy()
    floors = crit.half_floor(model, [((x,), 32, False)], [[ref]],
                             dtype=crit.floor_dtype("fp32"))
    assert floors is not None and floors[0].max_rel > REL_TOL["fp32"]  # PyTorch itself
    result = export_onnx(model, x, tmp_path / "m.onnx", "fp32")
    assert all(c.passed for c in result.checks), [c.line() for c in result.checks]

    model_file = onnx.load(tmp_path / "m.onnx")  # an export bug: one weight off by 1e-3
    init = next(t for t in model_file.graph.initializer if tuple(t.dims) == (10, 256))
    weight = numpy_helper.to_array(init).copy()
    weight[3, 7] += 1e-3
    init.CopyFrom(numpy_helper.from_array(weight, init.name))
    onnx.save(model_file, tmp_path / "bad.onnx")
    got = run_ort(ort_session(tmp_path / "bad.onnx"), [x])
    check = compare("fp32", [(got, [ref], False)], ["out"], half_floors=lambda: floors)[0]
    assert not check.passed and "float32 error" in check.detail, check.line()


def test_fp32_floor_is_not_applied_to_a_model_float32_does_not_move():
    ref = np.linspace(-10, 10, 40, dtype=np.float32).reshape(4, 10)
    got = ref.copy()
    got[0, 0] += 2e-4 * 10
    tiny = crit.HalfFloor(0.0, 0, 0, max_rel=1e-7)
    assert not compare("fp32", [([got], [ref], False)], ["out"],
                       half_floors=lambda: [tiny])[0].passed
