"""Generated kernels are real files in a cache directory, imported with importlib, so a user can
read every kernel and Numba's on-disk cache makes a warm compile fast. Lowering writes sources;
only the runtimes load them."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable

import numba

_LOADED: dict[str, Callable] = {}
_LOCK = threading.RLock()
_PRIVATE: set[str] = set()  # cache directories made user-only in this process


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
    """Write (once) and import a generated kernel module; return its ``kernel`` and the path.

    What runs is ``source`` itself, never the file's bytes: a cache file differing from it
    (planted, damaged, half written) is rewritten before Numba reads it for its own cache."""
    path = kernel_path(source, target, capability)
    with _LOCK:  # contexts bound on several threads load the same kernels
        if path in _LOADED:
            return _LOADED[path], path
        data = source.encode()
        _private_dirs(os.path.dirname(path))
        if _read(path) != data:
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        name = module_name(path, target)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        code = compile(source, path, "exec")  # the path names it for Numba's disk cache
        sys.modules[name] = module
        exec(code, module.__dict__)  # noqa: S102  (the source in hand, as lowering made it)
        _LOADED[path] = module.kernel
        return module.kernel, path


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _private_dirs(directory: str) -> None:
    """Make the cache directories user-only: Numba loads compiled code from its cache files
    beside each kernel, so a file another user could plant there would run."""
    if directory in _PRIVATE:
        return
    root = cache_root()
    parts = [root, os.path.join(root, "kernels"), directory]
    for d in parts:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(d, 0o700)
    _PRIVATE.add(directory)


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
