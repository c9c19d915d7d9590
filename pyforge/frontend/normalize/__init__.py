"""ONNX's opset forms -> one canonical node per op, before any rule of ``pyforge.ops`` sees it.

``NORMALIZE[op](node)`` rewrites the node in place; ``@normalizes("Reshape", ...)`` registers a
rule. One module per op family, mirroring ``pyforge/ops``.
"""

from . import einsum, elementwise, gathernd, index, nn, norm, quant, reduce, resize, scatter, shape  # noqa: F401
from . import sample as _sample  # noqa: F401  (RoiAlign, GridSample)
from .common import NORMALIZE, normalizes

__all__ = ["NORMALIZE", "normalizes"]
