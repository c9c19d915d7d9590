"""Shrink a failing graph to a small subgraph that fails the same way.

Greedy: try every intermediate value as the one output (its upstream subgraph), then every
intermediate value cut into a graph input (or, where pyforge needs a constant, an initializer)
holding what ORT computes there; keep the first smaller candidate whose failure class (and, for a
crash, exception type and place) is unchanged, and start again from it.

    python -m tests.fuzz.minimize --seed 123 [--out DIR]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .run import VARIANTS, Result, classify, ops_of, run_ort, run_reference, save_case


def _types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    g = inferred.graph
    return {vi.name: vi.type for vi in list(g.value_info) + list(g.output) + list(g.input)}


def _vi(name: str, types) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    vi.name = name
    vi.type.CopyFrom(types[name])
    return vi


def _values(model: onnx.ModelProto, feeds: dict, types) -> dict[str, np.ndarray]:
    """Every node output's value, computed by ORT (else the reference)."""
    names = [o for n in model.graph.node for o in n.output if o and o in types]
    full = onnx.ModelProto()
    full.CopyFrom(model)
    del full.graph.output[:]
    full.graph.output.extend(_vi(n, types) for n in names)
    try:
        return run_ort(full, feeds)
    except Exception:  # noqa: BLE001
        return run_reference(full, feeds)


def subgraph(
    model: onnx.ModelProto,
    outputs: list[str],
    types,
    cut: dict[str, np.ndarray] | None = None,
    feeds: dict | None = None,
    as_init: bool = False,
) -> tuple[onnx.ModelProto, dict]:
    """The nodes ``outputs`` need, with the ``cut`` values fed as inputs (or initializers)."""
    cut = cut or {}
    g = model.graph
    need = set(outputs)
    keep = []
    for node in reversed(g.node):
        if any(o in need for o in node.output) and not any(o in cut for o in node.output):
            keep.append(node)
            need.update(i for i in node.input if i)
    keep.reverse()
    inputs = [i for i in g.input if i.name in need]
    inits = [t for t in g.initializer if t.name in need]
    new_feeds = {k: v for k, v in (feeds or {}).items() if k in need}
    for name, arr in cut.items():
        if name not in need:
            continue
        if as_init:
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:
            inputs.append(_vi(name, types))
            new_feeds[name] = np.asarray(arr)
    graph = helper.make_graph(keep, g.name, inputs, [_vi(o, types) for o in outputs], inits)
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out, new_feeds


def _size(model: onnx.ModelProto) -> tuple[int, int]:
    return len(model.graph.node), len(model.graph.output)


def _candidates(model: onnx.ModelProto, feeds: dict):
    types = _types(model)
    produced = [o for n in model.graph.node for o in n.output if o and o in types]
    singles = [subgraph(model, [v], types, feeds=feeds) for v in produced]
    singles.sort(key=lambda c: _size(c[0]))
    yield from singles
    try:
        values = _values(model, feeds, types)
    except Exception:  # noqa: BLE001  (no backend computes the intermediates: no cuts)
        return
    outs = [o.name for o in model.graph.output]
    consumed = {i for n in model.graph.node for i in n.input}
    cuttable = [v for v in produced if v in consumed and v in values and v not in outs]
    for as_init in (False, True):
        cuts = [
            subgraph(model, outs, types, {v: values[v]}, feeds, as_init=as_init) for v in cuttable
        ]
        cuts.sort(key=lambda c: _size(c[0]))
        yield from cuts


def minimize(
    model: onnx.ModelProto, feeds: dict, res: Result, budget: int = 60
) -> tuple[onnx.ModelProto, dict]:
    """The smallest subgraph found (within ``budget`` runs) that fails as ``res`` did."""
    variants = res.variants[:1] or VARIANTS
    tries = 0

    def same_failure(cand: onnx.ModelProto, cand_feeds: dict) -> bool:
        nonlocal tries
        tries += 1
        try:
            onnx.checker.check_model(cand, full_check=True)
        except Exception:  # noqa: BLE001
            return False
        got = classify(cand, cand_feeds, variants)
        return got.cls == res.cls and (res.cls != "crash" or got.signature == res.signature)

    best, best_feeds = model, feeds
    progress = True
    while progress and tries < budget:
        progress = False
        try:
            cands = list(_candidates(best, best_feeds))
        except Exception:  # noqa: BLE001  (shape inference fails on this graph: stop here)
            break
        for cand, cand_feeds in cands:
            if tries >= budget:
                break
            if _size(cand) >= _size(best) or not cand.graph.node:
                continue
            if same_failure(cand, cand_feeds):
                best, best_feeds, progress = cand, cand_feeds, True
                break
    return best, best_feeds


def describe(model: onnx.ModelProto) -> str:
    """A short text form of a (small) model: one line per node with attributes and shapes."""
    types = _types(model)

    def shape(name: str) -> str:
        t = types.get(name)
        if t is None:
            return "?"
        elem = onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type).name
        dims = "x".join(str(d.dim_value) for d in t.tensor_type.shape.dim)
        return f"{elem}[{dims}]"

    lines = [f"opset {model.opset_import[0].version}"]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        attrs = ", ".join(
            f"{a.name}={helper.get_attribute_value(a)!r}"
            for a in node.attribute
            if a.name != "value"
        )
        args = []
        for i in node.input:
            if i in inits and inits[i].size <= 8:
                args.append(f"{i}={inits[i].tolist()}")
            else:
                args.append(f"{i}:{shape(i)}" if i else "''")
        outs = ", ".join(f"{o}:{shape(o)}" for o in node.output)
        lines.append(f"{outs} = {node.op_type}({', '.join(args)}{'; ' + attrs if attrs else ''})")
    return "\n".join(lines)


def main(argv=None) -> int:
    from .gen import generate

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget", type=int, default=80)
    args = ap.parse_args(argv)
    case = generate(args.seed)
    res = classify(case.model, case.feeds)
    print(f"seed {args.seed}: {res.cls} {'/'.join(res.variants)}: {res.detail}")
    if res.cls == "ok":
        return 0
    small, feeds = minimize(case.model, case.feeds, res, args.budget)
    print(describe(small))
    print(classify(small, feeds, res.variants[:1] or VARIANTS).detail)
    print(f"ops: {ops_of(small)}")
    print(f"recipe: {recipe(case.model, small)}")
    if args.out:
        save_case(args.out, f"seed{args.seed}_min", small, feeds)
    return 0


def recipe(original: onnx.ModelProto, small: onnx.ModelProto) -> dict:
    """How ``small`` is cut from ``original``: its outputs, and the values fed in as inputs or
    as initializers; ``rebuild`` makes it again from these few names."""
    g = original.graph
    have = {i.name for i in g.input} | {t.name for t in g.initializer}
    return {
        "outputs": [o.name for o in small.graph.output],
        "inputs": [i.name for i in small.graph.input if i.name not in have],
        "inits": [t.name for t in small.graph.initializer if t.name not in have],
    }


def rebuild(model: onnx.ModelProto, feeds: dict, cut: dict) -> tuple[onnx.ModelProto, dict]:
    """The subgraph ``recipe`` describes, its cut values computed by ORT on the whole graph."""
    types = _types(model)
    values = _values(model, feeds, types) if cut["inputs"] or cut["inits"] else {}
    small, small_feeds = subgraph(
        model, cut["outputs"], types, {v: values[v] for v in cut["inputs"]}, feeds
    )
    if cut["inits"]:
        small, small_feeds = subgraph(
            small,
            cut["outputs"],
            _types(small),
            {v: values[v] for v in cut["inits"]},
            small_feeds,
            as_init=True,
        )
    return small, small_feeds


if __name__ == "__main__":
    sys.exit(main())
