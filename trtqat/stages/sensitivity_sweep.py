"""The sensitivity sweep: configurations of quantized layers evaluated on batches held in
memory (the engine behind :func:`trtqat.stages.sensitivity.sensitivity`; see there)."""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from trtqat.families.types import SensitivityError
from trtqat.outputs import select
from trtqat.progress import progress as progress_of
from trtqat.quant.mixin import QUANT_LAYERS
from trtqat.quant.model_ops import quantizers
from trtqat.quant.tensor_quantizer import TensorQuantizer

log = logging.getLogger(__name__)

MODES = ("one-on", "one-off")
METRICS = ("top1", "loss", "output-mse")
_KEYS = {"top1": "top1", "loss": "loss", "output-mse": "output_mse"}


@dataclass
class SensitivityConfig:
    """Options of ``trtqat sensitivity`` (data options default to the checkpoint's run)."""

    checkpoint: str = ""
    out: str | None = None  # default: <checkpoint folder>/sensitivity
    mode: str = "one-on"
    metric: str = "top1"
    batches: int | None = None  # validation batches (default: the whole split)
    batch_size: int | None = None
    data: str | None = None
    image_size: int | tuple[int, int] | None = None
    top: int = 10
    suggest: int = 0
    cache: bool = True  # False: full forward passes only
    device: str = "cpu"
    progress: bool = True
    metric_output: str | None = None  # several outputs: the one scored (default: the first)
    threads: int | None = None  # CPU threads (trtqat.threads; None: torch's own)

    def __post_init__(self) -> None:
        if not str(self.checkpoint):
            raise SensitivityError("--checkpoint is required: the best.pt of a `trtqat "
                                   "calibrate` or `trtqat qat` run")
        if self.mode not in MODES:
            raise SensitivityError(f"unknown --mode {self.mode!r}: use one of {', '.join(MODES)}")
        if self.metric not in METRICS:
            raise SensitivityError(f"unknown --metric {self.metric!r}: use one of "
                                   f"{', '.join(METRICS)}")
        if self.image_size is not None:
            from trtqat.sizes import parse_size

            self.image_size = parse_size(self.image_size)
        for name in ("batches", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SensitivityError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.top < 1:
            raise SensitivityError(f"--top must be >= 1, got {self.top}")
        if self.suggest < 0:
            raise SensitivityError(f"--suggest must be >= 0, got {self.suggest}")


@dataclass
class SensitivityResult:
    """Baselines, per-layer rows (most sensitive first), timing and the suggestion."""

    config: dict[str, Any]
    baselines: dict[str, dict[str, float]]
    rows: list[dict[str, Any]]
    time_s: float
    engine: str  # "cached" (fx, downstream re-runs) or "plain" (full forward passes)
    images: int
    suggestion: dict[str, Any] | None = None
    paths: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "baselines": self.baselines, "rows": self.rows,
                "time_s": self.time_s, "engine": self.engine, "images": self.images,
                "suggestion": self.suggestion}


# --------------------------------------------------------------------------- layers
def layer_units(model: nn.Module) -> dict[str, list[TensorQuantizer]]:
    """Active quantizers grouped by the layer that owns them, in model order."""
    modules = dict(model.named_modules())
    units: dict[str, list[TensorQuantizer]] = {}
    for name, q in quantizers(model):
        if q.disabled:
            continue
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        owner = parent if parent and isinstance(modules.get(parent), QUANT_LAYERS) else name
        units.setdefault(owner, []).append(q)
    return units


# --------------------------------------------------------------------------- runners
class PlainRunner:
    """Every configuration is a full forward pass of the model with quantizers switched."""

    engine = "plain"
    which: str | None = None  # the output scored (--metric-output; None: the first)

    def __init__(self, model: nn.Module, units: dict[str, list[TensorQuantizer]]) -> None:
        self.model, self.units = model.eval(), units

    def logits(self, quantized: frozenset[str], x: torch.Tensor) -> torch.Tensor:
        """Output with exactly the layers in ``quantized`` quantized."""
        for name, qs in self.units.items():
            for q in qs:
                q.enable() if name in quantized else q.disable()
        return select(self.model(x), self.which)

    def sweep(self, base: frozenset[str], layers: list[str], x: torch.Tensor
              ) -> Iterator[torch.Tensor]:
        """Outputs of ``base`` with each layer of ``layers`` toggled in turn."""
        for layer in layers:
            yield self.logits(base ^ {layer}, x)

    def restore(self) -> None:
        """Leave every analysed quantizer enabled, as loaded."""
        for qs in self.units.values():
            for q in qs:
                q.enable()


class _LayerTracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, (*QUANT_LAYERS, TensorQuantizer)) or super().is_leaf_module(
            m, qualname)


_INPLACE_FUNCS = {operator.iadd, operator.isub, operator.imul, operator.itruediv}


class CachedRunner:
    """fx-traced runner: one base pass per batch, then only the nodes below a layer again.

    Holds a float copy (every quantizer off) and a quantized copy (weights fake-quantized
    once, input quantizers on) of the model; a configuration picks, per layer, which copy's
    module runs. Raises on graphs it cannot handle (the caller falls back to PlainRunner).
    """

    engine = "cached"
    which: str | None = None  # the output scored (--metric-output; None: the first)

    def __init__(self, model: nn.Module, units: dict[str, list[TensorQuantizer]]) -> None:
        fmodel = copy.deepcopy(model).eval()
        qmodel = copy.deepcopy(model).eval()
        for _, q in quantizers(fmodel):
            q.disable()
        with torch.no_grad():
            for m in qmodel.modules():
                wq = getattr(m, "_weight_quantizer", None)
                if isinstance(wq, TensorQuantizer) and not wq.disabled:
                    m.weight.data = wq(m.weight.detach())
                    wq.disable()
        for mod in (*fmodel.modules(), *qmodel.modules()):
            if getattr(mod, "inplace", False) is True:
                mod.inplace = False  # cached tensors must never be overwritten
        graph = _LayerTracer().trace(fmodel)
        self.gm = fx.GraphModule(fmodel, graph)
        self.nodes = list(self.gm.graph.nodes)
        for node in self.nodes:
            inplace = (node.op == "call_method" and node.target.endswith("_")
                       and not node.target.startswith("_")) or (
                node.op == "call_function" and (node.target in _INPLACE_FUNCS
                                                or node.kwargs.get("inplace") is True))
            if inplace:
                raise SensitivityError(f"in-place op {node.target} in the traced graph")
        self.output = next(n for n in self.nodes if n.op == "output")
        self.fmods = {n.target: self.gm.get_submodule(n.target) for n in self.nodes
                      if n.op == "call_module"}
        # a quantizer shared by several layers (a Concat/MaxPool scale group) is called under
        # one name from several places: every call belongs to the unit that owns it
        owner = {id(q): unit for unit, qs in units.items() for q in qs}
        modules = dict(model.named_modules())
        self.unit_of = {t: owner.get(id(modules.get(t)), t) for t in self.fmods}
        self.qmods = {t: qmodel.get_submodule(t) for t, unit in self.unit_of.items()
                      if unit in units}
        self.downstream = {name: self._below(name) for name in units}

    def _below(self, layer: str) -> list[fx.Node]:
        seen: set[fx.Node] = set()
        stack = [n for n in self.nodes if n.op == "call_module"
                 and self.unit_of.get(n.target) == layer]
        while stack:
            node = stack.pop()
            if node not in seen:
                seen.add(node)
                stack.extend(node.users)
        return [n for n in self.nodes if n in seen and n.op != "output"]

    def _run(self, nodes: list[fx.Node], env: dict, quantized: frozenset[str]) -> torch.Tensor:
        get = env.__getitem__
        for node in nodes:
            if node.op == "placeholder":
                continue
            args = fx.node.map_arg(node.args, get)
            kwargs = fx.node.map_arg(node.kwargs, get)
            if node.op == "call_module":
                mods = self.qmods if self.unit_of.get(node.target) in quantized else self.fmods
                env[node] = mods.get(node.target, self.fmods[node.target])(*args, **kwargs)
            elif node.op == "call_function":
                env[node] = node.target(*args, **kwargs)
            elif node.op == "call_method":
                env[node] = getattr(args[0], node.target)(*args[1:], **kwargs)
            elif node.op == "get_attr":
                obj = self.gm
                for part in str(node.target).split("."):
                    obj = getattr(obj, part)
                env[node] = obj
        return fx.node.map_arg(self.output.args[0], get)

    def _env(self, x: torch.Tensor) -> dict:
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        return {placeholders[0]: x}

    def logits(self, quantized: frozenset[str], x: torch.Tensor) -> torch.Tensor:
        """Output with exactly the layers in ``quantized`` quantized (a full pass)."""
        return select(self._run(self.nodes, self._env(x), quantized), self.which)

    def sweep(self, base: frozenset[str], layers: list[str], x: torch.Tensor
              ) -> Iterator[torch.Tensor]:
        """Outputs of ``base`` with each layer toggled: only its downstream nodes re-run."""
        env = self._env(x)
        out = select(self._run(self.nodes, env, base), self.which)
        for layer in layers:
            below = self.downstream[layer]
            if not below:
                yield out
                continue
            yield select(self._run(below, dict(env), base ^ {layer}), self.which)

    def restore(self) -> None:
        """Nothing to undo: the loaded model is never switched."""


def make_runner(model: nn.Module, units: dict[str, list[TensorQuantizer]], cache: bool = True,
                which: str | None = None) -> PlainRunner | CachedRunner:
    """The cached fx runner, or the plain one if asked or if tracing fails (logged);
    ``which`` names the output scored when the model returns several."""
    runner = _make_runner(model, units, cache)
    runner.which = which
    return runner


def _make_runner(model: nn.Module, units: dict[str, list[TensorQuantizer]], cache: bool
                 ) -> PlainRunner | CachedRunner:
    if cache:
        try:
            return CachedRunner(model, units)
        except Exception as exc:  # fx raises many kinds on untraceable control flow
            first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            log.warning("torch.fx cannot trace %s (%s): using full forward passes (slower, "
                        "same numbers)", type(model).__name__, first)
    return PlainRunner(model, units)


# --------------------------------------------------------------------------- metrics
class _Sums:
    """Loss, the family's top-1 and squared error vs the FP32 logits, summed over images."""

    def __init__(self, family) -> None:
        self.family = family
        self.loss = self.hits = self.sq = 0.0
        self.n = 0
        self.numel = 0

    def add(self, logits: torch.Tensor, y: torch.Tensor, ref: torch.Tensor) -> None:
        logits = logits.float()
        n = y.shape[0]
        self.loss += float(F.cross_entropy(logits, y, reduction="sum"))
        top1 = self.family.metric(logits.detach().cpu().numpy(), y.detach().cpu().numpy())
        self.hits += top1["top1"] * n / 100.0
        self.sq += float(((logits - ref) ** 2).sum())
        self.n += n
        self.numel += logits.numel()

    def metrics(self) -> dict[str, float]:
        n = max(self.n, 1)
        return {"top1": 100.0 * self.hits / n, "loss": self.loss / n,
                "output_mse": self.sq / max(self.numel, 1)}


def _harm(mode: str, m: dict[str, float], fp32: dict[str, float], quant: dict[str, float]
          ) -> dict[str, float]:
    """Effect of one layer per metric; larger means more sensitive."""
    if mode == "one-on":  # harm of quantizing only this layer, vs FP32
        return {"top1": fp32["top1"] - m["top1"], "loss": m["loss"] - fp32["loss"],
                "output_mse": m["output_mse"] - fp32["output_mse"]}
    # one-off: what leaving only this layer in float recovers, vs all quantized
    return {"top1": m["top1"] - quant["top1"], "loss": quant["loss"] - m["loss"],
            "output_mse": quant["output_mse"] - m["output_mse"]}


def evaluate_configs(runner, batches: list[tuple[torch.Tensor, torch.Tensor]],
                     refs: list[torch.Tensor], configs: list[frozenset[str]], family=None
                     ) -> list[dict[str, float]]:
    """Metrics of each configuration (a set of quantized layers) on every batch
    (top-1: ``family.metric``, the CNN's by default)."""
    family = family or _default_family()
    sums = [_Sums(family) for _ in configs]
    with torch.inference_mode():
        for (x, y), ref in zip(batches, refs):
            for s, cfg in zip(sums, configs):
                s.add(runner.logits(cfg, x), y, ref)
    return [s.metrics() for s in sums]


def _default_family():
    from trtqat import families

    return families.get("cnn")


def run_sweep(runner, units: dict[str, list[TensorQuantizer]], mode: str,
              batches: list[tuple[torch.Tensor, torch.Tensor]], progress: bool = True,
              family=None) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(baselines, per-layer metrics) of a one-on or one-off sweep over ``units``."""
    family = family or _default_family()
    layers = list(units)
    everything, nothing = frozenset(layers), frozenset()
    base = nothing if mode == "one-on" else everything
    with torch.inference_mode():
        refs = [runner.logits(nothing, x).float() for x, _ in batches]
    fp32, quant = evaluate_configs(runner, batches, refs, [nothing, everything], family)
    sums = {layer: _Sums(family) for layer in layers}
    bar = progress_of(total=len(layers) * len(batches), desc=f"sensitivity {mode}",
                      enabled=progress, unit="layer x batch")
    try:
        with torch.inference_mode():
            for (x, y), ref in zip(batches, refs):
                for layer, out in zip(layers, runner.sweep(base, layers, x)):
                    sums[layer].add(out, y, ref)
                    bar.update(1)
    finally:
        bar.close()
        runner.restore()
    return {"fp32": fp32, "quantized": quant}, {k: s.metrics() for k, s in sums.items()}


def rank(per_layer: dict[str, dict[str, float]], units: dict[str, list[TensorQuantizer]],
         baselines: dict[str, dict[str, float]], mode: str, metric: str) -> list[dict[str, Any]]:
    """Rows sorted most sensitive first: by ``metric``, ties broken by loss then output MSE."""
    key = _KEYS[metric]
    rows = []
    for layer, m in per_layer.items():
        harm = _harm(mode, m, baselines["fp32"], baselines["quantized"])
        rows.append({"layer": layer, "quantizers": [q._name for q in units[layer]], **m,
                     "effect": harm[key], "effects": harm})
    rows.sort(key=lambda r: (-r["effect"], -r["effects"]["loss"], -r["effects"]["output_mse"]))
    for i, row in enumerate(rows, 1):
        row["rank"] = i
    return rows
