"""Q/DQ placement from the traced graph: each rule on a tiny model of tests/catalogue.py."""

from __future__ import annotations

import copy
import io
import logging
import pickle

import catalogue
import pytest
import torch
from torch import nn

import trtqat
from trtqat.quant.model_ops import disable_quantization, quantizers
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.multihead import QuantMultiheadAttention
from trtqat.quant.plugins.sdpa import QuantSDPA
from trtqat.quant.tensor_quantizer import TensorQuantizer


def _placed(name: str, **config):
    model = catalogue.build(name)
    ref = copy.deepcopy(model)
    trtqat.quantize(model, config or None)
    return model, ref


def _names(model: nn.Module) -> set[str]:
    return {n for n, m in model.named_modules(remove_duplicate=False)
            if isinstance(m, TensorQuantizer)}


def _same_object(model: nn.Module, *names: str) -> bool:
    return len({id(model.get_submodule(n)) for n in names}) == 1


def _float_equal(model: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    disable_quantization(model)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)


def test_residual_add_quantizes_the_identity_input():
    model, ref = _placed("residual")
    names = _names(model)
    assert {"body.0.residual_quantizer", "body.1.residual_quantizer"} <= names
    assert type(model.body[0]).__name__ == "QuantBlock"
    x = catalogue.images(1)[0]
    seen = []
    model.body[0].residual_quantizer.register_forward_pre_hook(lambda m, a: seen.append(a[0]))
    _float_equal(model, ref, x)
    with torch.no_grad():  # the quantizer reads the block input (the identity), not the branch
        block_in = model.pool(model.stem(x))
    torch.testing.assert_close(seen[-1], block_in)


def test_concat_inputs_and_their_consumer_share_one_quantizer():
    model, ref = _placed("concat_upsample")
    assert _same_object(model, "concat_quantizer", "fuse.0.0._input_quantizer",
                        "down.pool_quantizer", "down.1.0._input_quantizer")
    _float_equal(model, ref, catalogue.images(1)[0])


def test_maxpool_input_and_output_share_one_scale():
    model, ref = _placed("maxpool")
    assert _same_object(model, "pool_quantizer", "body.0.conv1._input_quantizer",
                        "body.0.residual_quantizer")
    _float_equal(model, ref, catalogue.images(1)[0])


@pytest.mark.parametrize("name", ["se", "groupnorm"])
def test_se_and_groupnorm_blocks(name):
    model, ref = _placed(name)
    if name == "se":  # the inverted residual's identity, nothing on the gate's multiply
        assert {"body.0.residual_quantizer", "body.1.residual_quantizer"} <= _names(model)
    else:  # GroupNorm after the conv: no conv + add fusion to enable, no residual quantizer
        assert not any("residual" in n for n in _names(model))
    _float_equal(model, ref, catalogue.images(1)[0])


@pytest.mark.parametrize("name, kind", [("mha", QuantMultiheadAttention), ("sdpa", QuantSDPA),
                                        ("matmul_attention", QuantMatMul)])
def test_attention_products_get_both_operands_quantized(name, kind):
    model, ref = _placed(name)
    assert any(isinstance(m, kind) for m in model.modules())
    matmuls = [n for n, m in model.named_modules() if isinstance(m, QuantMatMul)]
    assert len(matmuls) == 2 and {n.rsplit(".", 1)[-1] for n in matmuls} == {
        "matmul_qk", "matmul_av"}
    assert not any("residual" in n for n in _names(model))  # the stream feeds LayerNorm
    _float_equal(model, ref, catalogue.images(1)[0])


def test_untraceable_module_keeps_layer_quantizers_with_one_note(caplog):
    with caplog.at_level(logging.WARNING):
        model, ref = _placed("untraceable")
    notes = [r.message for r in caplog.records if "could not be traced" in r.message]
    assert len(notes) == 1 and "body.0" in notes[0]
    assert "body.0.conv1._input_quantizer" in _names(model)
    assert "body.1.residual_quantizer" in _names(model)  # its traceable neighbour is placed
    _float_equal(model, ref, catalogue.images(1)[0])


def test_unused_module_is_left_out_with_one_note(caplog):
    model = catalogue.build("unused_head")
    with caplog.at_level(logging.WARNING):
        trtqat.quantize(model, {"method": "max"}, forward_loop=catalogue.images(2))
    notes = [r.message for r in caplog.records if "never ran" in r.message]
    assert len(notes) == 1 and "aux._input_quantizer" in notes[0]
    assert model.aux._input_quantizer.disabled and not model.trunk.head._input_quantizer.disabled


def test_placed_model_pickles_deepcopies_and_round_trips_its_state():
    model, ref = _placed("concat_upsample", method="max")
    trtqat.calibrate(model, catalogue.images(2), "max")
    x = catalogue.images(1, seed=3)[0]
    with torch.no_grad():
        want = model(x)
    buf = io.BytesIO()
    torch.save(model, buf)  # whole pickled models (Ultralytics' checkpoints)
    buf.seek(0)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model),
                  torch.load(buf, weights_only=False)):
        with torch.no_grad():
            torch.testing.assert_close(other(x), want)
        assert _same_object(other, "concat_quantizer", "fuse.0.0._input_quantizer")
    fresh = catalogue.build("concat_upsample")
    trtqat.quantize(fresh)
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), want)


def test_quantizing_twice_adds_nothing():
    model, _ = _placed("residual")
    before = sorted(_names(model))
    trtqat.quantize(model)
    assert sorted(_names(model)) == before


def test_pytorch_quantization_flow_keeps_existing_quantizers_and_their_ranges():
    from trtqat import quant_modules

    with quant_modules.initialized():
        model = catalogue.build("maxpool")
    trtqat.calibrate(model, catalogue.images(2), "max")  # the user's own calibration
    conv = model.body[0].conv1._input_quantizer
    amax = conv.amax.clone()
    trtqat.quantize(model)
    assert model.body[0].conv1._input_quantizer is conv and torch.equal(conv.amax, amax)
    assert model.pool_quantizer is conv  # the new MaxPool quantizer adopts the calibrated one


def test_describe_names_every_quantizer_and_its_rule():
    model, _ = _placed("concat_upsample")
    text = trtqat.describe(model)
    assert "[concat]" in text or "shared with" in text
    assert len(text.splitlines()) == len(list(quantizers(model)))


@pytest.mark.slow
def test_placed_model_compiles():
    model, ref = _placed("residual")
    disable_quantization(model)
    x = catalogue.images(1)[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(x), ref(x), rtol=1e-4, atol=1e-4)
