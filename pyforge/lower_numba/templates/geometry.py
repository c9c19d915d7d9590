"""Window geometry shared by the pool, conv and im2col templates of both layouts."""

from __future__ import annotations

from ...ir import Node


def spatial2d(shape: tuple[int, ...]) -> tuple[int, int]:
    """(H, W) of an NCHW or NCW tensor; 1-d windows run as 2-d with H = 1."""
    return (1, shape[2]) if len(shape) == 3 else (shape[2], shape[3])


def window2d(node: Node) -> tuple[list[int], list[int], list[int], list[int]]:
    k, s, d, p = (list(node.attrs[a]) for a in ("kernel_shape", "strides", "dilations", "pads"))
    if len(k) == 1:  # pads are [begin, end]; make them [top, left, bottom, right]
        return [1] + k, [1] + s, [1] + d, [0, p[0], 0, p[1]]
    return k, s, d, p


def nc_oh_ow(coords: list[str]) -> tuple[str, str, str, str]:
    """(n, c, oh, ow) of NCHW output coordinates; NCW ones get oh = 0."""
    return (coords[0], coords[1], "0", coords[2]) if len(coords) == 3 else tuple(coords)
