"""cuda forms for depthwise CNNs (EfficientNet's squeeze-excitation): a global pool over a large
plane as one block of threads per (n, c) row, a strided pass then a tree in shared memory.

The plain element form sums a plane in one thread: EfficientNet-B0's first squeeze-excitation
pool is 32 threads each reading 12,544 floats in turn. PYFORGE_POOL_ROWS=0 keeps that form (the
A/B switch of scripts/gpu_pool_ab.py). Both layouts (NHWC reads a row with stride C); the cpu
code is the element form's (its partial sums), at the row loop's level."""

from __future__ import annotations

import os

import numpy as np

from ...ir import Node
from ..emit import KernelBuilder, type_name
from ..registry import lowering
from ..scalar import lit

POOL_ROWS = 256  # a plane at least this large is pooled by a block of threads


def _plane(node: Node) -> int:
    shape = node.inputs[0].shape
    return int(np.prod(shape[1:3] if node.op.endswith("NHWC") else shape[2:]))


def block_pool(node: Node) -> bool:
    """GlobalAveragePool / GlobalMaxPool (either layout) over a plane of at least POOL_ROWS."""
    return os.environ.get("PYFORGE_POOL_ROWS", "1") != "0" and _plane(node) >= POOL_ROWS


def _rows(node: Node) -> int:
    return 4 if node.op.endswith("NHWC") else 2  # a row is one output element, (n, c)


@lowering("GlobalAveragePool", "GlobalMaxPool", "GlobalAveragePoolNHWC", "GlobalMaxPoolNHWC",
          form="element", when=block_pool, rows=_rows)  # fmt: skip
def global_pool_rows(node: Node, kb: KernelBuilder, coords: list[str]) -> str:
    from .window import global_reduce  # window imports this module for block_pool

    x = node.inputs[0]
    t, nhwc = type_name(x.dtype), node.op.endswith("NHWC")
    src, hw = kb.tensor(x.name), _plane(node)
    HW, C = kb.int_param(hw, "HW"), kb.int_param(x.shape[3 if nhwc else 1], "C")
    base, acc = kb.tmp("pb"), kb.tmp("acc")
    with kb.at_row():  # the plane's j-th element: at base + j (nchw), base + j * C (nhwc)
        first = (
            f"{coords[0]} * {HW} * {C} + {coords[3]}"
            if nhwc
            else f"({coords[0]} * {C} + {coords[1]}) * {HW}"
        )
        kb.emit(f"{base} = {first}")
    mark = len(kb.outer_lines)  # row_reduce writes at the row loop's level
    at = f"{src}[{base} + {C} * " if nhwc else f"{src}[{base} + "
    if node.op.startswith("GlobalMaxPool"):  # a NaN, once met, stays (np.max)
        pick = "({v} if {v} > {a} or {v} != {v} else {a})"
        kb.row_reduce(acc, lit(-np.inf, t), pick, "{v}", HW, at, t)
    else:
        kb.row_reduce(acc, lit(0, t), "{a} + {v}", "{v}", HW, at, t)
    kb.outer_lines[mark:] = [ln for ln in kb.outer_lines[mark:] if ln[1] is not None]  # cuda only
    # cpu: the element form's code (its partial sums), the cuda lines dropped
    mark = len(kb.lines)
    if nhwc:
        out = global_reduce(node, kb, HW, lambda j: f"{src}[{base} + {j} * {C}]")
    else:
        at_cpu = lambda j: f"{src}[u64({base} + {j})]"  # unsigned: no wrap
        out = global_reduce(node, kb, HW, lambda j: f"{src}[{base} + {j}]", at_cpu)
    cpu = [ln if isinstance(ln, str) else ln[0] for ln in kb.lines[mark:]]
    kb.lines[mark:] = [(ln, None) for ln in cpu if ln is not None]
    mean = f" / {t}({HW})" if node.op.startswith("GlobalAverage") else ""
    kb.lines.append((None, f"{out} = {acc}{mean}"))
    return out
