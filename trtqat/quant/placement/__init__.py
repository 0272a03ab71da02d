"""Q/DQ placement from the traced graph, by TensorRT's guidance (see :mod:`.place`)."""

from trtqat.quant.placement.describe import describe, describe_lines
from trtqat.quant.placement.place import PLACEMENT_VERSION, Placement, place

__all__ = ["PLACEMENT_VERSION", "Placement", "describe", "describe_lines", "place"]
