"""A calibrated (and a learnable-range) tiny quantized BERT traces under torch.compile in one graph."""

from __future__ import annotations

import pytest
import torch
from tiny_bert import calibrated_encoder


@pytest.mark.parametrize("learn_amax", [False, True])
def test_quantized_tiny_bert_traces_without_graph_break(tiny, sentences, learn_amax):
    model, tok = tiny
    q = calibrated_encoder(model, tok, sentences, max_length=16)
    if learn_amax:
        for module in q.modules():
            if hasattr(module, "init_learn_amax") and module.amax is not None and \
                    module.amax.numel() == 1:
                module.init_learn_amax()
    batch = tok(sentences[:2], padding=True, truncation=True, max_length=16, return_tensors="pt")
    torch._dynamo.reset()
    explain = torch._dynamo.explain(q.train())(batch["input_ids"], batch["attention_mask"])
    torch._dynamo.reset()
    assert explain.graph_break_count == 0, explain.break_reasons
    # in training a quantizer sits in an activation checkpoint (a subgraph of the graph)
    assert any("trtqat.fake_quant" in getattr(m, "code", "")
               for m in explain.graphs[0].modules())
