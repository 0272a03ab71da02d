"""``nn.modules.quant_rnn``: :class:`QuantLSTM` and :class:`QuantLSTMCell` (aliases ``LSTM``,
``LSTMCell``), as in pytorch-quantization.

Each LSTM step runs one fused GEMM at inference, so the step's input and hidden state are
quantized together by one input quantizer (their concatenation), and the input and hidden
weights together by one weight quantizer (per row of the 4 fused gates by default). A
multi-layer or bidirectional :class:`QuantLSTM` has one pair per layer and direction in
``_input_quantizers`` / ``_weight_quantizers``. Parameters are named as in ``torch.nn.LSTM``
so float checkpoints load. ``quant_modules.initialize()`` does not swap ``nn.LSTM``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import PackedSequence

from trtqat.errors import QuantConfigError, QuantTypeError
from trtqat.quant.descriptor import QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW
from trtqat.quant.mixin import QuantMixin, pop_quant_desc_in_kwargs
from trtqat.quant.tensor_quantizer import TensorQuantizer


def quant_lstm_cell(x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor],
                    w_ih: torch.Tensor, w_hh: torch.Tensor, b_ih: torch.Tensor | None,
                    b_hh: torch.Tensor | None, input_quantizer: TensorQuantizer | None = None,
                    weight_quantizer: TensorQuantizer | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step on ``(batch, features)``; returns ``(h, c)``.

    ``[x, h]`` goes through ``input_quantizer`` and ``[w_ih, w_hh]`` (joined along the input
    dimension) through ``weight_quantizer``, each as one tensor.
    """
    hx, cx = hidden
    if input_quantizer is not None:
        x, hx = input_quantizer(torch.cat([x, hx], 1)).split([x.size(1), hx.size(1)], 1)
    if weight_quantizer is not None:
        w_ih, w_hh = weight_quantizer(torch.cat([w_ih, w_hh], 1)).split([w_ih.size(1), w_hh.size(1)], 1)
    gates = F.linear(x, w_ih, b_ih) + F.linear(hx, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


class QuantLSTMCell(nn.LSTMCell, QuantMixin):
    """``nn.LSTMCell`` with quantized input+hidden and weights (one quantizer each)."""

    default_quant_desc_weight = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, **kwargs) -> None:
        quant_desc_input, quant_desc_weight = pop_quant_desc_in_kwargs(self.__class__, **kwargs)
        super().__init__(input_size, hidden_size, bias)
        self.init_quantizer(quant_desc_input, quant_desc_weight)

    def forward(self, input: torch.Tensor,  # noqa: A002 - torch's argument name
                hx: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        unbatched = input.dim() == 1
        if unbatched:
            input = input.unsqueeze(0)
            hx = None if hx is None else (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        if hx is None:
            zeros = input.new_zeros(input.size(0), self.hidden_size)
            hx = (zeros, zeros)
        h, c = quant_lstm_cell(input, hx, self.weight_ih, self.weight_hh, self.bias_ih,
                               self.bias_hh, self._input_quantizer, self._weight_quantizer)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)


class QuantLSTM(nn.LSTM, QuantMixin):
    """``nn.LSTM`` with one input and one weight quantizer per layer and direction.

    Raises ValueError for ``proj_size > 0`` (not supported there either) and TypeError for a
    PackedSequence input (pad the batch instead).
    """

    default_quant_desc_weight = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, *args, **kwargs) -> None:
        quant_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("quant_desc")}
        quant_desc_input, quant_desc_weight = pop_quant_desc_in_kwargs(self.__class__, **quant_kwargs)
        super().__init__(*args, **kwargs)
        if self.proj_size > 0:
            raise QuantConfigError("proj_size is not supported in QuantLSTM: use proj_size=0")
        self.init_quantizer(quant_desc_input, quant_desc_weight,
                            num_layers=self.num_layers * (2 if self.bidirectional else 1))

    def forward(self, input: torch.Tensor,  # noqa: A002 - torch's argument name
                hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if isinstance(input, PackedSequence):
            raise QuantTypeError("QuantLSTM takes a padded tensor, not a PackedSequence")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1)
            hx = None if hx is None else (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        elif self.batch_first:
            input = input.transpose(0, 1)
        dirs = 2 if self.bidirectional else 1
        if hx is None:
            zeros = input.new_zeros(self.num_layers * dirs, input.size(1), self.hidden_size)
            hx = (zeros, zeros)
        h_n, c_n = [], []
        layer_input = input
        for layer in range(self.num_layers):
            outputs = []
            for d in range(dirs):
                k = layer * dirs + d
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                weights = [getattr(self, f"{n}{suffix}", None)
                           for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
                state = (hx[0][k], hx[1][k])
                steps = range(layer_input.size(0))
                out = []
                for t in (reversed(steps) if d else steps):
                    state = quant_lstm_cell(layer_input[t], state, *weights,
                                            self._input_quantizers[k], self._weight_quantizers[k])
                    out.append(state[0])
                if d:
                    out.reverse()
                outputs.append(torch.stack(out, 0))
                h_n.append(state[0])
                c_n.append(state[1])
            layer_input = torch.cat(outputs, 2)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, training=True)
        output, h, c = layer_input, torch.stack(h_n, 0), torch.stack(c_n, 0)
        if unbatched:
            return output.squeeze(1), (h.squeeze(1), c.squeeze(1))
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, (h, c)


LSTM = QuantLSTM
LSTMCell = QuantLSTMCell

__all__ = ["LSTM", "LSTMCell", "QuantLSTM", "QuantLSTMCell", "quant_lstm_cell"]
