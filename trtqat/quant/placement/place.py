"""``place``: every quantizer TensorRT's Q/DQ placement asks for, in one call.

0. re-parameterizable blocks (timm's ``reparameterize()``: RepVGG, MobileOne) are fused
   (:mod:`trtqat.quant.reparam`), unless ``QuantConfig(reparameterize=False)``;
1. layers: Conv/ConvTranspose/Linear (and average pooling) become Quant* layers
   (:func:`trtqat.quant.model_ops.quantize`), subclasses with a forward of their own through
   the weight they compute (:mod:`trtqat.quant.own_forward`); Quant* layers already there
   (a model built under ``quant_modules.initialize()``) keep their quantizers and
   calibration state;
2. attention: Hugging Face attention (``trtqat.quant.plugins.attention``) and
   ``nn.MultiheadAttention`` (``trtqat.quant.plugins.multihead``);
3. the graph rules (:mod:`.rules`) on every module FX can trace, with shared scales
   (:mod:`.groups`); a module that cannot be traced keeps its layers' quantizers and gets
   its own matmul/linear/attention/concat calls quantized where it makes them
   (:mod:`trtqat.quant.plugins.calls`), and one NOTE line names those modules.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from trtqat.errors import QuantConfigError
from trtqat.quant.config import QuantConfig
from trtqat.quant.descriptor import QuantDescriptor
from trtqat.quant.functional_layers import quantize_window_attention
from trtqat.quant.model_ops import name_quantizers, skipped
from trtqat.quant.model_ops import quantize as quantize_layers
from trtqat.quant.placement.flow import ModelFlow
from trtqat.quant.placement.groups import build_groups, compatible, realised, representative
from trtqat.quant.placement.rewrite import RewriteError, by_module, rewrite_module, unique_attr
from trtqat.quant.placement.rules import RULE_TEXT, Site, find_sites
from trtqat.quant.plugins.calls import hook_calls
from trtqat.quant.plugins.matmul import QuantMatMul
from trtqat.quant.plugins.multihead import QuantMultiheadAttention, quantize_multihead, supported
from trtqat.quant.plugins.sdpa import QuantSDPA
from trtqat.quant.reparam import reparameterize
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger("trtqat.quant.placement")

# recorded in checkpoints ("legacy": earlier versions; "graph-1": before own-forward
# Conv/Linear subclasses were quantized and re-parameterizable blocks fused; "graph-2":
# before the residual rule looked through untraced modules, QuantConfig.untraced_exits)
PLACEMENT_VERSION = "graph-3"
GRAPH_2 = "graph-2"
GRAPH_1 = "graph-1"


@dataclass
class Placement:
    """What :func:`place` added: ``(name, rule)`` per quantizer or module, the modules it
    could not trace (``path: reason``) and whether the model has attention."""

    added: list[tuple[str, str]] = field(default_factory=list)
    untraced: dict[str, str] = field(default_factory=dict)
    hooked: list[str] = field(default_factory=list)
    attention: bool = False
    notes: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per added quantizer: its name and the rule behind it."""
        return [f"{name}  [{rule}] {RULE_TEXT.get(rule, rule)}" for name, rule in self.added]


def _skip(path: str, patterns: tuple[str, ...]) -> bool:
    parts = path.split(".") if path else []
    return any(skipped(".".join(parts[:i]), patterns) for i in range(1, len(parts) + 1))


def _attention_plugins(model: nn.Module, cfg: QuantConfig, desc: QuantDescriptor,
                       result: Placement) -> None:
    if any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        from trtqat.quant.plugins.attention import quantize_attention

        try:
            for name in quantize_attention(model, desc):
                result.added.append((name, "hf-attention"))
            result.attention = True
        except QuantConfigError as exc:  # said only where there is attention to leave
            if any("attention" in type(m).__name__.lower() for m in model.modules()):
                result.notes.append(f"Hugging Face attention left in float: {exc}")


def _multihead(model: nn.Module, flow: ModelFlow, cfg: QuantConfig, desc: QuantDescriptor,
               result: Placement) -> None:
    for path, m in list(model.named_modules()):
        if type(m) is not nn.MultiheadAttention or _skip(path, cfg.skip_layers):
            continue
        why = supported(m)
        if why is not None:
            result.notes.append(f"{path} (nn.MultiheadAttention) stays float: {why}")
            continue
        calls = [node for _, node in flow.sites.get(path, [])]
        self_attention = all(len(n.args) >= 3 and n.args[0] is n.args[1] is n.args[2]
                             for n in calls)
        quantize_multihead(m, desc, cfg.quant_desc_weight or _row_weight(cfg),
                           separate_inputs=bool(calls) and not self_attention)
        result.added.append((path, "mha"))
        result.attention = True
    for m in model.modules():  # PyTorch's fused fast path would skip the quantized module
        if isinstance(m, nn.TransformerEncoderLayer) and \
                isinstance(m.self_attn, QuantMultiheadAttention):
            m.activation_relu_or_gelu = 0


def _hook_untraced(model: nn.Module, flow: ModelFlow, cfg: QuantConfig, desc: QuantDescriptor,
                   result: Placement, modules: Callable[[nn.Module], bool] | None) -> None:
    """Modules FX cannot trace get their matmul/linear/attention/concat calls quantized
    where they are called (:mod:`trtqat.quant.plugins.calls`)."""
    for path in flow.failed:
        m = model.get_submodule(path) if path else model
        if type(m).__call__ is not nn.Module.__call__ or _skip(path, cfg.skip_layers) or \
                (modules is not None and not modules(m)):
            continue
        if hook_calls(m, desc, cfg.quant_desc_weight or _row_weight(cfg)):
            result.hooked.append(path)
            result.added.append((path or type(m).__name__, "calls"))


def _name_of(model: nn.Module, module: nn.Module) -> str:
    return next((n for n, m in model.named_modules() if m is module), "")


def _row_weight(cfg: QuantConfig) -> QuantDescriptor:
    return QuantDescriptor(num_bits=cfg.num_bits, axis=(0,))


def place(model: nn.Module, config: QuantConfig | None = None, *,
          modules: Callable[[nn.Module], bool] | None = None,
          exact_types: bool = False) -> Placement:
    """Insert, in place, every quantizer of TensorRT's Q/DQ placement (see module doc).

    ``modules`` limits the graph rules to the modules it accepts and ``exact_types`` the
    layers to torch.nn's own classes (the legacy placement of old checkpoints:
    torchvision's residual blocks only).
    """
    cfg = config or QuantConfig()
    desc = cfg.input_descriptor()
    result = Placement()
    if cfg.reparameterize:
        _reparameterize(model)
    quantize_layers(model, QuantConfig(quant_desc_input=desc,
                                       quant_desc_weight=cfg.quant_desc_weight,
                                       float_module_list=cfg.float_module_list,
                                       skip_layers=cfg.skip_layers), exact_types=exact_types,
                    own_forward=cfg.own_forward)
    if cfg.num_bits != 8 and cfg.quant_desc_weight is None:
        for name, q in model.named_modules():
            if name.endswith("_weight_quantizer") and isinstance(q, TensorQuantizer):
                q.num_bits = cfg.num_bits
    if cfg.attention:
        _attention_plugins(model, cfg, desc, result)
        for module in quantize_window_attention(model, desc):
            result.added.append((_name_of(model, module), "window-attention"))
            result.attention = True
    if not cfg.graph:
        name_quantizers(model)
        return result
    flow = ModelFlow(model, untraced_exits=cfg.untraced_exits)
    result.untraced = dict(flow.failed)
    if cfg.attention:
        _multihead(model, flow, cfg, desc, result)
        _hook_untraced(model, flow, cfg, desc, result, modules)

    def allowed(path: str) -> bool:
        ok = modules is None or modules(flow.traces[path].module)
        return ok and not _skip(path, cfg.skip_layers)

    sites = find_sites(flow, cfg.rules(), allowed)
    _apply(flow, sites, desc, result)
    result.attention |= any(isinstance(m, (QuantMatMul, QuantSDPA)) for m in model.modules())
    name_quantizers(model)
    _report(model, result)
    return result


def _reparameterize(model: nn.Module) -> None:
    changed = reparameterize(model)
    if changed:
        kinds = ", ".join(f"{n} {k}" for k, n in changed.most_common())
        log.warning("NOTE re-parameterized %d module(s) in place before quantizing (%s), as "
                    "timm.utils.reparameterize_model does: each is one conv now, as deployed; "
                    "QuantConfig(reparameterize=False) keeps the training form (INT8 export "
                    "then refuses it)", sum(changed.values()), kinds)


def _apply(flow: ModelFlow, sites: list[Site], desc: QuantDescriptor, result: Placement
           ) -> None:
    groups = build_groups(flow, sites)
    objects: dict[int, nn.Module] = {}
    shared = []
    for group in groups.values():
        if group.shared and realised(group):
            rep = representative(group) or TensorQuantizer(desc)
            shared.append((group, rep))
            for m in group.members:
                if m.site is not None:
                    objects[id(m.site)] = rep
    for site in sites:
        if id(site) in objects:
            continue
        if site.kind == "replace":
            objects[id(site)] = QuantSDPA(desc) if site.rule == "sdpa" else QuantMatMul(desc)
        elif site.rule not in ("concat", "maxpool"):  # an unrealised shared site is dropped
            objects[id(site)] = TensorQuantizer(desc)
    applied: set[int] = set()
    for path, module_sites in by_module([s for s in sites if id(s) in objects]).items():
        module = flow.traces[path].module
        taken: set[str] = set()
        pairs = []
        for site in module_sites:
            attr = unique_attr(module, site.attr, taken)
            setattr(module, attr, objects[id(site)])
            pairs.append((site, attr))
        try:
            rewrite_module(flow, path, pairs)
        except RewriteError as exc:
            for _, attr in pairs:
                delattr(module, attr)
            result.notes.append(f"{path or type(module).__name__}: training-mode graph "
                                f"differs ({exc}); it keeps its layers' quantizers only")
            continue
        for site, attr in pairs:
            applied.add(id(site))
            result.added.append((flow.full_name(path, attr), site.rule))
    for group, rep in shared:
        if not any(m.site is not None and id(m.site) in applied for m in group.members):
            continue
        for m in group.members:
            if m.site is not None:
                continue
            current = getattr(m.owner, m.attr)
            if current is rep:
                continue
            if rep._calibrator is not None and not compatible(current, rep) and \
                    current._amax is not None:
                continue  # a calibrated quantizer of another format keeps its own range
            setattr(m.owner, m.attr, rep)
            result.added.append((m.name, "shared"))


def _report(model: nn.Module, result: Placement) -> None:
    for line in result.lines():
        log.info("placement: %s", line)
    if result.untraced:
        names = [f"{p or type(model).__name__} ({why})" for p, why in result.untraced.items()]
        shown = "; ".join(names[:4]) + (f"; +{len(names) - 4} more" if len(names) > 4 else "")
        if result.hooked:
            keep = ("their layers' Q/DQ, and the matmul/linear/attention/concat calls of "
                    "their own code are quantized where called (no residual rule inside)")
        else:
            keep = "their layers' Q/DQ only (no residual/concat/attention rules inside)"
        result.notes.insert(0, f"{len(names)} module(s) could not be traced, so they keep "
                               f"{keep}: {shown}")
    for note in result.notes:
        log.warning("NOTE %s", note)
