"""Generated kernels are real files in a cache directory, imported with importlib, so a user can
read every kernel and Numba's on-disk cache makes a warm compile fast. Lowering writes sources;
only the runtimes load them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable

import numba

_LOADED: dict[str, Callable] = {}


def cache_root() -> str:
    root = os.environ.get("PYFORGE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "pyforge"
    )
    return root


def kernel_path(source: str, target: str, capability: str = "") -> str:
    """The file a kernel source lives in: keyed by source, target, numba version, device."""
    key = f"{source}\0{target}\0{numba.__version__}\0{capability}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:20]
    return os.path.join(cache_root(), "kernels", target, f"k_{digest}.py")


def load_kernel(source: str, target: str, capability: str = "") -> tuple[Callable, str]:
    """Write (once) and import a generated kernel module; return its ``kernel`` and the path."""
    path = kernel_path(source, target, capability)
    if path in _LOADED:
        return _LOADED[path], path
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(source)
        os.replace(tmp, path)
    name = module_name(path, target)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[path] = module.kernel
    return module.kernel, path


def module_name(path: str, target: str) -> str:
    """The ``sys.modules`` name a kernel file is imported under (generated drivers refer to it)."""
    return f"pyforge_kernels.{target}.{os.path.basename(path)[:-3]}"


def sequence(parts: list[Callable[[], None]]) -> Callable[[], None]:
    """One callable running bound ``parts`` in order (a GEMM step's prologue, GEMM, epilogue)."""
    if len(parts) == 1:
        return parts[0]

    def run() -> None:
        for part in parts:
            part()

    return run
