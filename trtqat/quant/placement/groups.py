"""Shared scales: tensors TensorRT joins (Concat inputs and output, MaxPool input and output,
data movement, nearest upsampling) form one group, and every quantizer that reads a tensor of
a group with a Concat or MaxPool becomes one :class:`TensorQuantizer` object.

One object called on every member is the sharing mechanism: its calibrator sees every
member's values (their statistics merge), QAT trains one range, ``state_dict`` holds the
same values under each name (old checkpoints load), and the ONNX file gets equal scales.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import fx, nn

from trtqat.quant.placement import ops
from trtqat.quant.placement.flow import ModelFlow, Ref
from trtqat.quant.placement.rules import Site
from trtqat.quant.tensor_quantizer import TensorQuantizer


class _Union:
    def __init__(self) -> None:
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


@dataclass
class Member:
    """A quantizer reading a tensor of a group: an existing one (``owner.attr``) or a site."""

    owner: nn.Module | None = None
    attr: str = ""
    name: str = ""
    site: Site | None = None


@dataclass
class Group:
    """Tensors that share one scale, and the quantizers reading them."""

    tensors: list[Ref] = field(default_factory=list)
    members: list[Member] = field(default_factory=list)
    shared: bool = False  # holds a Concat or MaxPool site: its quantizers become one


def _joins(flow: ModelFlow, ref: Ref) -> bool:
    return (ops.is_passthrough(flow, ref) or ops.is_maxpool(flow, ref)
            or ops.is_nearest_upsample(flow, ref))


def build_groups(flow: ModelFlow, sites: list[Site]) -> dict[object, Group]:
    """The groups of tensors with a quantizer on them, keyed by their union root."""
    uf = _Union()
    for path, trace in flow.traces.items():
        for node in trace.graph.nodes:
            ref = (path, node)
            src = node.args[0] if node.args else None
            if _joins(flow, ref) and isinstance(src, fx.Node) and ops.is_tensor(src):
                uf.union(flow.resolve((path, src)), flow.resolve(ref))
    for site in sites:
        for m in site.members:
            uf.union(site.members[0], m)
    groups: dict[object, Group] = {}
    for key in list(uf.parent):
        groups.setdefault(uf.find(key), Group()).tensors.append(key)
    for site in sites:
        if site.kind != "quantize" or not site.members:
            continue
        key = uf.find(site.members[0])
        groups.setdefault(key, Group(tensors=[site.members[0]]))
        groups[key].members.append(Member(site=site))
        groups[key].shared |= site.rule in ("concat", "maxpool")
    for group in groups.values():
        seen: set[int] = set()
        for tensor in group.tensors:
            for member in _readers(flow, tensor):
                slot = id(getattr(member.owner, member.attr))
                if slot not in seen:
                    seen.add(slot)
                    group.members.append(member)
    return {k: g for k, g in groups.items() if g.members}


def _readers(flow: ModelFlow, tensor: Ref) -> list[Member]:
    """Existing quantizers that read ``tensor`` (layer inputs, QuantMatMul operands,
    quantizer calls written in a traced forward)."""
    found = []
    for (path, user), seen in flow.uses(tensor):
        module = ops.called(flow, (path, user))
        if module is None:
            continue
        trace = flow.traces[path]
        if ops.is_quantizer(module):
            parent_name, _, attr = str(user.target).rpartition(".")
            owner = trace.module.get_submodule(parent_name) if parent_name else trace.module
            found.append(Member(owner, attr, flow.full_name(path, str(user.target))))
            continue
        index = next((i for i, a in enumerate(user.args) if a is seen), None)
        slot = ops.input_quantizer(module, index) if index is not None else None
        if slot is not None:
            name = flow.full_name(flow.full_name(path, str(user.target)), slot[1])
            found.append(Member(slot[0], slot[1], name))
    return found


def realised(group: Group) -> bool:
    """A Concat/MaxPool site pays off only when something else in its group is quantized."""
    return any(m.site is None or m.site.rule not in ("concat", "maxpool") for m in group.members)


def compatible(a: TensorQuantizer, b: TensorQuantizer) -> bool:
    """Two quantizers that may become one (same format and calibrator kind)."""
    return (a._num_bits == b._num_bits and a._unsigned == b._unsigned and a._axis == b._axis
            and a._narrow_range == b._narrow_range
            and type(a._calibrator) is type(b._calibrator))


def representative(group: Group) -> TensorQuantizer | None:
    """The quantizer a shared group keeps: an existing one that holds a range (the
    pytorch-quantization flow calibrates before placing), else the first existing one."""
    existing = [getattr(m.owner, m.attr) for m in group.members if m.site is None]
    with_range = [q for q in existing if q._amax is not None]
    return (with_range or existing or [None])[0]
