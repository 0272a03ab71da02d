"""The placement rules: where TensorRT wants a Q/DQ that no layer quantizer provides.

Each rule looks at one op of a traced module and returns a :class:`Site`:

* ``residual-add``: the input of an Add that does not come from a conv (through BatchNorm,
  dropout, data movement, a constant scale, or a module FX cannot trace whose forward
  returns a conv's output, :mod:`.returns`) when the other one does, so TensorRT fuses
  conv + add in INT8. Transformer residuals (the sum, or the identity, feeding a LayerNorm)
  are left alone: they stay in float.
* ``concat``: every input of a Concat through one shared quantizer.
* ``maxpool``: the input of a MaxPool, with the scale of its output's consumers.
* ``matmul``: both operands of an activation x activation MatMul/BMM (``QuantMatMul``),
  attention's Q.K^T (``matmul_qk``) and P.V (``matmul_av``) included.
* ``sdpa``: ``F.scaled_dot_product_attention`` computed with two ``QuantMatMul``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import fx

from trtqat.quant.placement import ops
from trtqat.quant.placement.flow import ModelFlow, Ref
from trtqat.quant.placement.returns import returning_child

RULE_TEXT = {
    "residual-add": "residual Add input (TensorRT fuses conv + add in INT8)",
    "concat": "Concat inputs, one scale shared with the Concat's consumers",
    "maxpool": "MaxPool input, one scale with its output",
    "matmul": "MatMul operands (activation x activation)",
    "sdpa": "scaled_dot_product_attention: Q.K^T and P.V operands",
    "calls": "matmul/linear/attention/concat calls of a module FX cannot trace",
    "mha": "nn.MultiheadAttention: projections and Q.K^T, P.V operands",
    "layer": "layer input and weight",
    "shared": "shares the scale of its Concat/MaxPool group",
    "attention": "attention products Q.K^T and P.V (both operands)",
    "window-attention": "Swin window attention: Q.K^T and P.V operands",
    "hf-attention": "Hugging Face attention: Q.K^T and P.V operands",
}


@dataclass
class Site:
    """One change to one module's graph: a quantizer on input ``arg`` of ``node``
    (``kind`` "quantize"), or ``node`` replaced by a call of a new child ("replace")."""

    path: str
    node: fx.Node
    rule: str
    kind: str
    attr: str = ""
    arg: int | tuple[int, int] | None = None  # args index, or (0, item) of a Concat list
    value: fx.Node | None = None
    members: list[Ref] = field(default_factory=list)  # tensors that share the scale


def _data_input(node: fx.Node) -> object:
    return node.args[0] if node.args else None


def from_weighted(flow: ModelFlow, ref: Ref, depth: int = 0) -> bool:
    """True when the value of ``ref`` is a conv's or Linear's output (through BatchNorm,
    activations, dropout, data movement, constant scales and linked modules)."""
    if depth > 32:
        return False
    path, node = flow.resolve(ref)
    module = ops.called(flow, (path, node))
    if module is not None:
        if ops.is_weighted(module):
            return True
        if ops.is_batchnorm(module) or ops.is_passthrough(flow, (path, node)) or \
                ops.is_activation(flow, (path, node)):
            src = _data_input(node)
            return isinstance(src, fx.Node) and from_weighted(flow, (path, src), depth + 1)
        return _exits_in_weighted(flow, flow.child_path(path, node), depth)
    if ops.is_passthrough(flow, (path, node)) or ops.is_activation(flow, (path, node)):
        src = _data_input(node)
        return isinstance(src, fx.Node) and from_weighted(flow, (path, src), depth + 1)
    scaled, src = ops.is_scale_by_constant(node)
    if scaled and src is not None:
        return from_weighted(flow, (path, src), depth + 1)
    return False


def _exits_in_weighted(flow: ModelFlow, child: str | None, depth: int) -> bool:
    """An unlinked traced child (called from several places) whose output is a conv's, or
    a child FX cannot trace whose forward returns the output of a child that is one
    (``out = self.proj(out)`` / ``return out``, :mod:`.returns`)."""
    if child is None or depth > 32:
        return False
    if child not in flow.traces:
        module = flow.model.get_submodule(child) if child in flow.failed and \
            flow.untraced_exits else None
        inner = returning_child(module) if module is not None else None
        if inner is None:
            return False
        return ops.is_weighted(inner) or _exits_in_weighted(
            flow, flow.path_of.get(id(inner)), depth + 1)
    out = flow.output(child)
    return isinstance(out, fx.Node) and from_weighted(flow, (child, out), depth + 1)


def _feeds_float_norm(flow: ModelFlow, ref: Ref) -> bool:
    """The value goes (through data movement) into LayerNorm/GroupNorm/Softmax."""
    todo, seen = [ref], set()
    while todo:
        cur = todo.pop()
        if cur in seen or len(seen) > 256:
            continue
        seen.add(cur)
        for user in flow.consumers(cur):
            if ops.is_float_only(flow, user) and not ops.is_batchnorm(ops.called(flow, user)):
                return True
            if ops.is_passthrough(flow, user):
                todo.append(user)
    return False


def residual_site(flow: ModelFlow, path: str, node: fx.Node) -> Site | None:
    """The identity input of a residual Add, or None."""
    args = [a for a in node.args[:2]]
    if len(args) != 2 or not all(ops.is_tensor(a) and not ops.is_constant(a) for a in args):
        return None
    conv = [from_weighted(flow, (path, a)) for a in args]
    if not any(conv):
        return None
    # the branch TensorRT fuses with the Add is a layer output used by the Add alone; the
    # other input (the identity, also read by the block's first layer) gets the quantizer
    fusable = [c and len(flow.consumers(flow.resolve((path, a)))) == 1
               for c, a in zip(conv, args)]
    if not any(fusable):
        return None  # no layer output TensorRT could fuse with the Add
    index = 0 if fusable[1] and not fusable[0] else 1  # both: out + identity
    other = args[index]
    producer = flow.resolve((path, other))
    if ops.is_quantizer(ops.called(flow, producer)):
        return None  # already quantized (a placed model, a hand-written quantizer)
    if _feeds_float_norm(flow, (path, node)) or _feeds_float_norm(flow, producer):
        return None  # a transformer's residual stream: LayerNorm runs in float
    return Site(path, node, "residual-add", "quantize", "residual_quantizer", index, other,
                [producer])


def concat_site(flow: ModelFlow, path: str, node: fx.Node) -> Site | None:
    """One shared quantizer on every input of a Concat (realised only when the group it
    joins has quantized consumers)."""
    items = node.args[0]
    if not items or not all(isinstance(v, fx.Node) and ops.is_tensor(v) for v in items):
        return None
    if any(ops.is_quantizer(ops.called(flow, flow.resolve((path, v)))) for v in items):
        return None
    members = [flow.resolve((path, v)) for v in items] + [(path, node)]
    return Site(path, node, "concat", "quantize", "concat_quantizer", None, None, members)


def maxpool_site(flow: ModelFlow, path: str, node: fx.Node) -> Site | None:
    """A quantizer on a MaxPool's input sharing its output consumers' scale."""
    src = _data_input(node)
    if not isinstance(src, fx.Node):
        return None
    module = ops.called(flow, (path, node))
    if module is not None and hasattr(module, "_input_quantizer"):
        return None  # a QuantMaxPool quantizes its input itself
    if ops.is_quantizer(ops.called(flow, flow.resolve((path, src)))):
        return None
    return Site(path, node, "maxpool", "quantize", "pool_quantizer", 0, src,
                [flow.resolve((path, src)), (path, node)])


def _role(node: fx.Node) -> str:
    """matmul_qk when the product goes into a Softmax, matmul_av when an operand comes
    from one (through scaling, masking and dropout), else matmul."""
    def reaches_softmax(n: fx.Node, depth: int = 0) -> bool:
        if depth > 6:
            return False
        for u in n.users:
            if (u.op == "call_function" and getattr(u.target, "__name__", "") in (
                    "softmax", "_softmax")) or (u.op == "call_method" and u.target == "softmax"):
                return True
            if u.op in ("call_function", "call_method") and reaches_softmax(u, depth + 1):
                return True
        return False

    def from_softmax(n: object, depth: int = 0) -> bool:
        if not isinstance(n, fx.Node) or depth > 4:
            return False
        if (n.op == "call_function" and getattr(n.target, "__name__", "") in (
                "softmax", "_softmax")) or (n.op == "call_method" and n.target == "softmax"):
            return True
        return n.op in ("call_function", "call_method", "call_module") and bool(n.args) and \
            from_softmax(n.args[0], depth + 1)

    if any(from_softmax(a) for a in node.args[:2]):
        return "matmul_av"
    return "matmul_qk" if reaches_softmax(node) else "matmul"


def matmul_site(flow: ModelFlow, path: str, node: fx.Node) -> Site | None:
    """Both operands of an activation x activation product (a QuantMatMul)."""
    a, b = (node.args + (None, None))[:2]
    if not (ops.is_tensor(a) and ops.is_tensor(b)) or node.kwargs:
        return None
    if ops.is_constant(a) and ops.is_constant(b):
        return None
    return Site(path, node, "matmul", "replace", _role(node))


def sdpa_site(flow: ModelFlow, path: str, node: fx.Node) -> Site | None:
    return Site(path, node, "sdpa", "replace", "sdpa")


def find_sites(flow: ModelFlow, rules: frozenset[str], allowed=lambda path: True) -> list[Site]:
    """Every site of the enabled ``rules`` in the traced modules ``allowed`` selects."""
    found = []
    for path, trace in flow.traces.items():
        if not allowed(path) or getattr(type(trace.module), "_trtqat_spec", None) is not None:
            continue  # placed modules keep their placement
        for node in trace.graph.nodes:
            ref = (path, node)
            site = None
            if "residual-add" in rules and ops.is_add(ref):
                site = residual_site(flow, path, node)
            elif "concat" in rules and ops.is_cat(ref):
                site = concat_site(flow, path, node)
            elif "maxpool" in rules and ops.is_maxpool(flow, ref):
                site = maxpool_site(flow, path, node)
            elif "matmul" in rules and ops.is_matmul(ref):
                site = matmul_site(flow, path, node)
            elif "sdpa" in rules and ops.is_sdpa(ref):
                site = sdpa_site(flow, path, node)
            if site is not None:
                found.append(site)
    return found
