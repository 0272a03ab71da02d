"""benchmarks/qat_fusion.py: how it counts inductor's kernels (a compiled run takes minutes
on two cores: `python benchmarks/qat_fusion.py --model tiny --steps 2` checks it by hand)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import qat_fusion  # noqa: E402

CODE = '''
cpp_fused_add_copy__fake_quant_0 = async_compile.cpp_pybinding(['float*'], r"""
    auto tmp1 = std::nearbyint(tmp0 / amax);
""")
cpp_fused_relu_1 = async_compile.cpp_pybinding(['float*'], r"""
    auto tmp1 = max(tmp0, 0);
""")
cpp_fused_fake_quant_fake_quant_grad_2 = async_compile.cpp_pybinding(['float*'], r"""
    auto tmp1 = std::nearbyint(tmp0);
""")
def call(args):
    buf0 = extern_kernels.convolution(arg0, arg1)
    buf1 = extern_kernels.mm(buf0, arg2)
'''


def test_count_kernels_tells_fused_quantizers_from_standalone_ones():
    c = qat_fusion.count_kernels([CODE])
    assert c == {"generated": 3, "extern": 2, "rounding": 2, "quant_only": 1}


@pytest.mark.parametrize("name, alone", [
    ("cpp_fused_fake_quant_fake_quant_grad_3", True),
    ("triton_poi_fused_clamp_div_fake_quant_mul_round_7", True),
    ("cpp_fused__native_batch_norm_legit_functional_copy__fake_quant_relu_1", False),
    ("cpp_fused_sum_2", False)])
def test_quant_only_name(name, alone):
    assert qat_fusion.quant_only_name(name) is alone
