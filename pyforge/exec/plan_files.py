"""Reading a saved plan as data: plan.json's checksum, then every file it lists checked for
size and sha256 before its bytes are used, then every slot and step checked (``verify.py``),
then the steps and kernel sources regenerated from the description and compared with the stored
ones: a kernel that is not byte for byte what pyforge's emitter makes of it is refused.

No name in plan.json resolves outside the plan directory: a kernel key is a plain file-name
stem (no '/', '\\', '..' or leading '.'), and the only files read are ``plan.json``,
``weights.bin`` and ``kernels/<key>.<target>.py``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from .steps import step_from_json
from .verify import check_plan

_KEY = re.compile(r"[A-Za-z0-9_-]{1,128}")
_TARGETS = ("cpu", "cuda")
_FIELDS = {  # plan.json's fields and their JSON types
    "arena_bytes": int,
    "slots": dict,
    "steps": list,
    "inputs": list,
    "outputs": list,
    "state": dict,
    "state_bytes": int,
    "stats": dict,
    "kernels": list,
    "files": dict,
    "description": dict,
    "checksum": str,
}


def read_plan(cls: type, directory: str, regenerate: Any) -> Any:
    from .plan import FORMAT, WEIGHTS, meta_checksum

    meta = _read_meta(directory)
    if meta.get("format") != FORMAT:
        raise ModelLoadError(
            f"the plan at {directory} has format {meta.get('format')!r}, this pyforge reads "
            f"format {FORMAT}: it was saved by another pyforge version and must be recompiled"
        )
    for name, kind in _FIELDS.items():
        if not isinstance(meta.get(name), kind):
            raise ModelLoadError(f"{directory}/plan.json: field {name!r} is missing or malformed")
    if meta["checksum"] != meta_checksum(meta):
        raise ModelLoadError(
            f"{directory}/plan.json: field 'checksum' does not match the file's content: "
            "it was edited or damaged after saving; save or compile the plan again"
        )
    files = meta["files"]
    kernels: dict[str, dict[str, str]] = {}
    for key in meta["kernels"]:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ModelLoadError(f"{directory}/plan.json: field 'kernels': bad key {key!r}")
        kernels[key] = {}
        for target in _TARGETS:
            name = f"kernels/{key}.{target}.py"
            if name in files:
                kernels[key][target] = _source(directory, name, files[name])
    known = {WEIGHTS} | {f"kernels/{k}.{t}.py" for k in kernels for t in _TARGETS}
    for name in files:
        if name not in known:  # a name of some other file, or one reaching outside
            raise ModelLoadError(f"{directory}/plan.json: field 'files': unexpected {name!r}")
    if WEIGHTS not in files:
        raise ModelLoadError(f"{directory}/plan.json: field 'files' has no {WEIGHTS!r} entry")
    weights = _checked(directory, WEIGHTS, files[WEIGHTS])
    plan = cls(
        meta["arena_bytes"],
        _slots(directory, meta["slots"]),
        _steps(directory, meta["steps"]),
        kernels,
        meta["inputs"],
        meta["outputs"],
        weights,
        meta["stats"],
        state=meta["state"],
        state_bytes=meta["state_bytes"],
    )
    check_plan(plan)
    plan.description = meta["description"]
    if regenerate is None:
        plan.trusted = False
    else:
        _compare(directory, plan, *regenerate(plan.description, plan))
    return plan


def _compare(directory: str, plan: Any, steps: list, kernels: dict[str, dict[str, str]]) -> None:
    """Every stored kernel source and step equal to the regenerated one, which then replace them."""
    for key in sorted(set(kernels) | set(plan.kernels)):
        for target in _TARGETS:
            made, stored = kernels.get(key, {}).get(target), plan.kernels.get(key, {}).get(target)
            if made == stored:
                continue
            parts = [
                p for s in steps + plan.steps for p in (*s.parts(), getattr(s, "fallback", None))
            ]
            what = f"kernel {key!r} ({next((p.label for p in parts if p and p.kernel == key), '')})"
            if stored is None:
                raise ModelLoadError(
                    f"{directory}/plan.json: field 'description' lowers to {what}, which the "
                    f"plan does not hold"
                )
            raise ModelLoadError(
                f"{directory}/kernels/{key}.{target}.py: {what} is not the source its "
                "description lowers to (edited, or saved by another pyforge); it is not imported"
            )
    for i, (made, stored) in enumerate(zip(steps + [None], plan.steps + [None])):
        if made != stored:
            raise ModelLoadError(
                f"{directory}/plan.json: step {i} is not what its description lowers to"
            )
    plan.kernels = kernels


def _read_meta(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "plan.json")
    if not os.path.isfile(path):
        raise ModelLoadError(f"no saved plan at {directory} (plan.json missing)")
    try:
        with open(path, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError, RecursionError) as e:
        raise ModelLoadError(f"{path}: not a readable plan.json ({e})") from None
    if not isinstance(meta, dict):
        raise ModelLoadError(f"{path}: not a plan (a JSON object is expected)")
    return meta


def _checked(directory: str, name: str, entry: Any) -> np.ndarray:
    """The bytes of the plan's file ``name``, once their size and sha256 match plan.json."""
    path = os.path.join(directory, *name.split("/"))
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise ModelLoadError(f"{directory}/plan.json: field 'files' entry {name!r} is malformed")
    try:
        data = np.fromfile(path, np.uint8)
    except OSError:
        raise ModelLoadError(f"{path}: missing or unreadable (plan.json lists it)") from None
    if data.size != entry.get("size"):
        raise ModelLoadError(
            f"{path}: field 'size': the file has {data.size} bytes, plan.json says "
            f"{entry.get('size')!r} (truncated, enlarged or replaced)"
        )
    if hashlib.sha256(data.data).hexdigest() != entry["sha256"]:
        raise ModelLoadError(f"{path}: field 'sha256' does not match the file: it was changed")
    return data


def _source(directory: str, name: str, entry: Any) -> str:
    try:
        return _checked(directory, name, entry).tobytes().decode()
    except UnicodeDecodeError:
        raise ModelLoadError(f"{directory}/{name}: not a kernel source (not UTF-8)") from None


def _slots(directory: str, raw: dict[str, Any]) -> dict:
    from .plan import Slot

    slots = {}
    for name, s in raw.items():
        try:
            slot = Slot(s["region"], s["offset"], tuple(s["shape"]), s["dtype"])
            recorded = s["nbytes"]
        except (KeyError, TypeError) as e:
            raise ModelLoadError(
                f"{directory}/plan.json: slot {name!r} is malformed ({e})"
            ) from None
        try:
            size = slot.nbytes
        except (TypeError, ValueError, OverflowError):
            size = None
        if size is None or size != recorded:
            raise ModelLoadError(
                f"{directory}/plan.json: slot {name!r}, field 'shape'/'dtype': "
                f"{list(slot.shape)} x {slot.dtype!r} is not its recorded {recorded!r} bytes"
            )
        slots[name] = slot
    return slots


def _steps(directory: str, raw: list[Any]) -> list:
    steps = []
    for i, d in enumerate(raw):
        try:
            steps.append(step_from_json(d))
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ModelLoadError(
                f"{directory}/plan.json: step {i} is malformed ({type(e).__name__}: {e})"
            ) from None
    return steps
