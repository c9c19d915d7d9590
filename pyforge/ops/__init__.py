"""What each op IS, in one place: its shape/dtype rule, numpy reference, kind and flags.

Every layer above reads this table (``OPS[name]``); none keeps its own set of op names.
"""

from . import (  # noqa: F401
    attention,
    dynamic,
    einsum,
    elementwise,
    gathernd,
    index,
    nn,
    norm,
    quant,
    reduce,
    resize,
    sample,
    scatter,
    shape,
)
from .registry import OPS, OpDef, infer_node

__all__ = ["OPS", "OpDef", "infer_node"]
