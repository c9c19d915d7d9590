"""Every op's lowering, one module per family; importing the package registers them all.

A module imports only the registry, the emitter and sibling modules it names (never this
package), so each can be imported alone; shared helpers are public functions of ``geometry``.
"""

from . import (  # noqa: F401
    attention,
    conv,
    depthwise,
    einsum,
    elementwise,
    gemm,
    geometry,
    index,
    nhwc,
    norm,
    quant,
    reduce,
    resize,
    sample,
    scatter,
    softmax,
    window,
)
