"""Which scales a tensor carries, for the Concat and MaxPool rules of the lint: the Q/DQ
it comes through and every QuantizeLinear that reads the same values elsewhere (through
data movement), so different scales are seen wherever the Q/DQ sits."""

from __future__ import annotations

import numpy as np

# Single-input ops that only move data: TensorRT moves Q/DQ across them.
DATA_MOVEMENT = {"Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Identity"}


def all_equal(scales: list[np.ndarray]) -> bool:
    """Every scale equal (none or one: True)."""
    return all(np.array_equal(s, scales[0]) for s in scales[1:])


def distinct(scales: list[np.ndarray]) -> int:
    """How many different scales ``scales`` holds."""
    seen: list[np.ndarray] = []
    for s in scales:
        if not any(np.array_equal(s, t) for t in seen):
            seen.append(s)
    return len(seen)


def source(linter, tensor: str) -> str:
    """``tensor`` before the data movement (and DequantizeLinear) that produced it."""
    for _ in range(16):
        node = linter.g.producer.get(tensor)
        if node is None or node.op_type not in DATA_MOVEMENT | {"DequantizeLinear"}:
            return tensor
        if node.op_type == "DequantizeLinear":
            q = linter.g.produced_by(node.input[0], "QuantizeLinear")
            if q is None:
                return tensor
            tensor = q.input[0]
            continue
        tensor = node.input[0]
    return tensor


def consumer_scales(linter, tensor: str) -> list[np.ndarray]:
    """Scales of the QuantizeLinear nodes reading ``tensor`` (through data movement)."""
    found, todo, seen = [], [tensor], set()
    while todo:
        t = todo.pop()
        for user in linter.g.consumers.get(t, []):
            if id(user) in seen:
                continue
            seen.add(id(user))
            if user.op_type == "QuantizeLinear" and user.input[0] == t:
                scale = linter._scale(user)
                if scale is not None:
                    found.append(scale)
            elif user.op_type in DATA_MOVEMENT and user.input[0] == t:
                todo.extend(o for o in user.output if o)
    return found


def scales_of(linter, tensor: str) -> list[np.ndarray]:
    """Every scale ``tensor``'s values are quantized with: the Q/DQ it comes through and
    the QuantizeLinear nodes elsewhere that read the same values."""
    dq = linter._dq(tensor)
    scales = [] if dq is None else [s for s in [linter._scale(dq)] if s is not None]
    return scales + consumer_scales(linter, source(linter, tensor))
