"""Exceptions raised by pyforge. Every one names what it is about: node, op, opset, input."""


class PyforgeError(Exception):
    """Base class of every error pyforge raises on purpose."""


class ModelLoadError(PyforgeError):
    """The model file is missing, truncated or not ONNX."""


class UnsupportedOperatorError(PyforgeError):
    """An op (or an attribute value of it) that pyforge cannot compile for this target."""

    def __init__(self, op: str, node: str, opset: int | None = None, detail: str = ""):
        self.op, self.node, self.opset = op, node, opset
        where = (
            f"op {op!r} (opset {opset}) at node {node!r}"
            if opset
            else f"op {op!r} at node {node!r}"
        )
        super().__init__(f"unsupported {where}" + (f": {detail}" if detail else ""))


class DataDependentError(UnsupportedOperatorError):
    """A node needs before the run what only the run gives: the values of run-time tensors
    (``values``: a shape, pads, k... that sets an output shape), or, where ``values`` is empty,
    its inputs, because its output shape depends on their data (NonZero, NonMaxSuppression).
    ``compile`` answers it by running the model in stages (``pyforge/staged.py``); ``top`` is
    the index of the model's node that raised it, ``taken`` those of the nodes imported before
    it, both set by the importer."""

    def __init__(self, op: str, node: str, opset: int | None, detail: str, values=()):
        self.values = tuple(values)
        self.top: int | None = None
        self.taken: list[int] = []
        super().__init__(op, node, opset, detail)


class BadAttributeError(PyforgeError):
    """An attribute or constant input has a value the op does not accept."""

    def __init__(self, op: str, node: str, detail: str):
        self.op, self.node = op, node
        super().__init__(f"bad attribute in op {op!r} at node {node!r}: {detail}")


class ShapeError(PyforgeError):
    """Input shapes of a node are inconsistent, or a shape cannot be inferred statically."""

    def __init__(self, op: str, node: str, detail: str):
        self.op, self.node = op, node
        super().__init__(f"shape error in op {op!r} at node {node!r}: {detail}")


class ResourceError(PyforgeError, MemoryError):
    """A model or plan needs more memory than the ``memory_limit`` compile option allows;
    raised before anything that size is allocated."""

    def __init__(self, what: str, need: int, limit: int):
        self.need, self.limit = need, limit
        super().__init__(
            f"{what} need {need:,} bytes ({need / 2**30:.2f} GiB), over the memory limit of "
            f"{limit:,} bytes ({limit / 2**30:.2f} GiB); if the machine has the room, raise the "
            "compile option memory_limit (bytes; default 75% of physical memory), else give "
            "smaller input shapes"
        )


class InputError(PyforgeError):
    """predict() was given a wrong input name, shape or dtype."""


class IndexRangeError(PyforgeError, IndexError):
    """A run-time index input (Gather, GatherElements, GatherND) is outside [-dim, dim)."""

    def __init__(self, step: str, detail: str):
        self.step = step
        super().__init__(f"{step}: {detail}")


class IRVerificationError(PyforgeError):
    """Graph.verify() found a broken invariant (SSA, order, shapes): a compiler bug."""


class OptionError(PyforgeError, ValueError):
    """A compile or load option with an unknown name or a wrong value, or one that the target
    (or a saved plan) does not take; raised before any work starts."""

    def __init__(self, option: str, detail: str):
        self.option = option
        super().__init__(detail)
