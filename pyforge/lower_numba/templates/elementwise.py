"""Elementwise ops lower as the scalar expressions of scalar.SCALAR, fused into any kernel."""

from __future__ import annotations

from ..registry import register_lowering
from ..scalar import SCALAR

for _op, _expr in SCALAR.items():
    register_lowering(_op, "scalar", _expr)
