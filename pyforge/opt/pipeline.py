"""The pass pipeline, listed once: which passes run, in which order, for a set of options.

Takes plain values (not the face's CompileOptions), so opt stays below the face.
"""

from __future__ import annotations

from . import attention, canonicalize, norms, simplify  # noqa: F401  (register passes)
from . import fusion as _fusion  # noqa: F401
from . import layout as _layout  # noqa: F401
from . import precision as _precision  # noqa: F401

# folding before and after bn_fold/split_bias: both leave constant subexpressions behind;
# conv_dead_taps after bn_fold, which rewrites the conv weights it cuts
CLEANUP = [
    "const_fold",
    "drop_identity",
    "bn_fold",
    "conv_dead_taps",
    "split_bias",
    "const_fold",
    "dce",
]


def pass_names(layout: str = "nchw", precision: str = "fp32", fusion: bool = True) -> list[str]:
    """The passes compile() runs, in order, for these option values.

    >>> pass_names(layout="nhwc", fusion=False)[-3:]
    ['nhwc_layout', 'dce', 'no_fuse']
    """
    names = list(CLEANUP)
    if fusion:  # before fp16, whose casts would split the pattern
        # dce: the transposes attention reads through
        names += ["attention", "rms_norm", "dce"]
    if layout == "nhwc":
        names += ["nhwc_layout", "dce"]  # the layout pass leaves dead transposes of constants
    if precision == "fp16":
        names.append("fp16")
    if fusion:  # after attention, which reads its operands back through the Transposes
        names += ["unit_transpose", "merge_matmuls", "slice_view", "residual_rms_norm"]
    names.append("fuse" if fusion else "no_fuse")
    return names
