"""What the compiler did to a model, as text or as one self-contained HTML page.

>>> m = pyforge.compile("mlp.onnx", target="cpu")
>>> print(explain.report(m))                  # passes, fused groups, kernels, memory plan
>>> explain.write_html(m, "mlp.html")         # the same, plus the graph and arena as SVG
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field
from typing import Any

from .exec.steps import KernelStep, Step

MiB = 2**20


@dataclass
class Group:
    """One node of the optimised graph (a fused group, or a node left alone) and its steps."""

    index: int
    name: str
    kind: str  # the anchor op, "elementwise" for a pure elementwise group, else the node's op
    members: list[tuple[str, str]]  # (op, node name) in execution order
    shape: tuple[int, ...]
    preds: list[int] = field(default_factory=list)  # indices of groups, -1 for a graph input
    steps: list[int] = field(default_factory=list)


def groups(model: Any) -> list[Group]:
    """The optimised graph's nodes with their member ops, predecessors and plan steps."""
    graph = model.details["graph"]
    producer: dict[int, int] = {}
    out: list[Group] = []
    by_member: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        members = node.group.members if node.group is not None else None
        if members:
            anchor = node.group.anchor
            kind = anchor.op if anchor is not None else "elementwise"
            pairs = [(m.op, m.name) for m in members]
        else:
            kind, pairs = node.op, [(node.op, node.name)]
        g = Group(i, node.name, kind, pairs, tuple(node.outputs[0].shape) if node.outputs else ())
        for v in node.inputs:
            if v is None or v.const is not None:
                continue
            p = producer.get(id(v), -1)
            if p not in g.preds:
                g.preds.append(p)
        for v in node.outputs:
            producer[id(v)] = i
        for _, name in pairs:
            by_member[name] = i
        by_member.setdefault(node.name, i)
        out.append(g)
    for s, label in enumerate(model.details["step_labels"]):
        owner = by_member.get(label.rsplit(" ", 1)[-1])
        if owner is not None:
            out[owner].steps.append(s)
    return out


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB" if n >= MiB // 10 else f"{n:,} B"


def step_parts(step: Step) -> list[tuple[str, str, str]]:
    """(what, kernel key or "", label) for each part of a step: a kernel, or a GEMM with the
    kernels fused before and after it."""
    if isinstance(step, KernelStep):
        return [("kernel", step.kernel, step.label)]
    parts = [("gemm", "", step.label)]
    if step.prologue:
        parts.insert(0, ("prologue", step.prologue.kernel, step.prologue.label))
    if step.epilogue:
        parts.append(("epilogue", step.epilogue.kernel, step.epilogue.label))
    return parts


def step_lines(model: Any) -> list[tuple[int, str, str, str, str]]:
    """(step index, part, label, what runs it, its source file or "") for every part of every
    step the runtime runs, as it bound it: the GEMM's implementation (pyforge sgemm, OpenBLAS,
    cuBLASLt and its algorithm) and generated driver, each kernel's file, or an epilogue done
    in the GEMM's store."""
    rt = model.runtime
    loaded = getattr(rt, "kernel_paths", {})
    impls, drivers = getattr(rt, "gemm_impls", {}), getattr(rt, "driver_paths", {})
    out = []
    for i, step in enumerate(model.plan.steps):
        fallback = getattr(step, "fallback", None)
        for what, key, label in step_parts(step):
            if what == "gemm":
                path = drivers.get(i, "")
                if fallback is not None and fallback.kernel in loaded:
                    path = loaded[fallback.kernel]  # a runtime without cuBLASLt: the plain kernel
                impl = impls.get(i, "GEMM")
                out.append((i, what, label, f"{impl}{', driver' if i in drivers else ''}", path))
            elif key in loaded:
                out.append((i, what, label, "kernel", loaded[key]))
            elif what == "epilogue":  # applied by the GEMM as it stores D
                out.append((i, what, label, "in the GEMM's store (no launch)", ""))
            # else an im2col this runtime does not run: its driver reads the image itself
    return out


def _source(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        return f"(cannot read {path}: {e.strerror})"


def memory_summary(stats: dict) -> str:
    arena, naive, low = stats["arena_bytes"], stats["naive_bytes"], stats["lower_bound_bytes"]
    over = (arena / low - 1) * 100 if low else 0.0
    scratch = stats.get("scratch_bytes", 0)  # columns a GEMM driver here needs after all
    return (
        f"arena {_mib(arena)} vs one buffer per tensor {_mib(naive)} "
        f"({naive / max(arena, 1):.1f}x smaller); liveness lower bound {_mib(low)} "
        f"(arena {over:.1f}% above it; strategy {stats.get('memory_strategy', '?')})"
        + (f"; column scratch {_mib(scratch)} beside it" if scratch else "")
    )


def report(model: Any) -> str:
    """Plain-text explanation: ops after each pass, groups, kernels and the memory plan."""
    d, stats, plan = model.details, model.stats, model.plan
    lines = [f"== passes ({stats['ops_in']} ONNX ops -> {stats['ops_out']} nodes)"]
    prev = None
    for name, count in d["pass_ops"]:
        delta = "" if prev is None or count == prev else f"  ({count - prev:+d})"
        secs = d["pass_seconds"].get(name)
        t = f"  {secs * 1e3:7.2f} ms" if secs is not None and name != "import" else ""
        lines.append(f"  {name:<14} {count:5d} ops{t}{delta}")
        prev = count
    gs = groups(model)
    lines.append(f"\n== fused groups ({len(gs)})")
    for g in gs:
        ops = " + ".join(op for op, _ in g.members)
        lines.append(f"  [{g.index:3d}] {g.name:<34} {ops}  -> {list(g.shape)}")
    parts = step_lines(model)
    lines.append(
        f"\n== steps ({len(plan.steps)} steps, {stats['launches']} launches per inference, "
        f"{len({p for *_, p in parts if p})} distinct kernel and driver sources on {model.target})"
    )
    home = os.path.expanduser("~")
    for i, what, label, how, path in parts:
        path = "~" + path[len(home) :] if path.startswith(home + os.sep) else path
        lines.append(f"  {i:4d} {what:<8} {_short(label, 40):<40} {how}  {path}".rstrip())
    lines.append(f"\n== memory plan ({len(d['buffers'])} arena tensors)")
    lines.append(f"  {'tensor':<36} {'bytes':>12} {'live steps':>12} {'offset':>12}")
    for name, size, first, last, off in sorted(d["buffers"], key=lambda b: (b[2], b[4])):
        lines.append(f"  {name:<36} {size:12,d} {f'{first}-{last}':>12} {off:12,d}")
    lines.append("  " + memory_summary(stats))
    return "\n".join(lines + egraph_lines(d.get("egraph")))


def egraph_lines(rep: Any) -> list[str]:
    """The e-graph optimiser's regions, each alternative's cost (measured, cached or analytic),
    the one chosen, and the search log (``optimizer="egraph"``)."""
    if rep is None:
        return []
    lines = [f"\n== e-graph ({len(rep.regions)} regions, {rep.seconds * 1e3:.1f} ms in all)"]
    if rep.saturation is not None:
        sat = rep.saturation
        lines.append(
            f"  saturation: {sat.iterations} iterations, {sat.applied} merges, "
            f"{sat.nodes} e-nodes, {sat.stopped_by}"
        )
    for r in rep.regions:
        names = " | ".join(m.name for m, _ in r.gemms)
        alts = "  ".join(f"{k} {v[0] * 1e3:.3f} ms ({v[1]})" for k, v in r.alternatives.items())
        lines.append(f"  {_short(names, 60):<60} {alts}  -> {r.chosen}")
    if rep.searches:
        lines.append("  search: " + rep.search_line())
    return lines


# -- HTML -------------------------------------------------------------------------------------

BOX_W, GAP_X, GAP_Y, LINE_H, HEAD_H = 250, 40, 34, 14, 34
COLORS = {
    "Conv": "#dbe8ff",
    "Gemm": "#eadcff",
    "MatMul": "#eadcff",
    "MaxPool": "#dff3e0",
    "AveragePool": "#dff3e0",
    "GlobalAveragePool": "#dff3e0",
    "GlobalMaxPool": "#dff3e0",
    "elementwise": "#fff1cc",
}


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "\u2026"


def graph_svg(gs: list[Group]) -> str:
    """Groups as boxes listing their member ops, in layers top to bottom, edges between them."""
    layer: dict[int, int] = {-1: 0}
    for g in gs:  # nodes are in topological order
        layer[g.index] = 1 + max((layer[p] for p in g.preds), default=0)
    rows: dict[int, list[Group]] = {}
    for g in gs:
        rows.setdefault(layer[g.index], []).append(g)
    widest = max([len(r) for r in rows.values()] + [1])
    width = widest * (BOX_W + GAP_X) + 2 * GAP_X + 120  # right margin for skip edges
    pos: dict[int, tuple[float, float, float]] = {}  # index -> (centre x, top y, height)
    y = 20.0
    pos[-1] = (width / 2 - 60, y, 26)
    parts = [
        f'<rect x="{width / 2 - 120}" y="{y}" width="120" height="26" rx="13" class="io"/>',
        f'<text x="{width / 2 - 60}" y="{y + 17}" text-anchor="middle">input</text>',
    ]
    y += 26 + GAP_Y
    for li in sorted(rows):
        row = rows[li]
        h = max(HEAD_H + LINE_H * len(g.members) + 6 for g in row)
        x0 = (width - len(row) * (BOX_W + GAP_X) + GAP_X) / 2 - 60
        for j, g in enumerate(row):
            x = x0 + j * (BOX_W + GAP_X)
            bh = HEAD_H + LINE_H * len(g.members) + 6
            pos[g.index] = (x + BOX_W / 2, y, bh)
            fill = COLORS.get(g.kind, "#eeeeee")
            tip = "\n".join(f"{op} {name}" for op, name in g.members)
            parts.append(
                f"<g><title>{_esc(g.name)}\n{_esc(tip)}\nsteps {g.steps}</title>"
                f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{bh}" rx="6" '
                f'fill="{fill}" class="box"/>'
                f'<text x="{x + 8}" y="{y + 14}" class="head">#{g.index} '
                f"{_esc(_short(g.name, 30))}</text>"
                f'<text x="{x + 8}" y="{y + 28}" class="sub">{_esc(g.kind)} '
                f"{_esc(list(g.shape))} \u00b7 {len(g.steps)} step(s)</text>"
            )
            for k, (op, name) in enumerate(g.members):
                parts.append(
                    f'<text x="{x + 14}" y="{y + HEAD_H + 10 + k * LINE_H}" class="mem">'
                    f"{_esc(op)} <tspan class='dim'>{_esc(_short(name, 28))}</tspan></text>"
                )
            parts.append("</g>")
        y += h + GAP_Y
    edges = []
    for g in gs:
        cx, top, _ = pos[g.index]
        for p in g.preds:
            px, ptop, ph = pos[p]
            sy = ptop + ph
            if layer[g.index] - layer[p] <= 1:
                my = (sy + top) / 2
                d = f"M{px},{sy} C{px},{my} {cx},{my} {cx},{top}"
            else:  # a skip edge (a residual) leaves and enters on the right, clear of boxes
                bx = max(px, cx) + BOX_W / 2 + 30 + 8 * (layer[g.index] - layer[p])
                y0, y1 = ptop + ph * 0.75, top + 12
                sx, ex = px + BOX_W / 2, cx + BOX_W / 2
                d = f"M{sx},{y0} C{bx},{y0} {bx},{y1} {ex},{y1}"
            edges.append(f'<path d="{d}" class="edge" marker-end="url(#arrow)"/>')
    height = y + 10
    defs = (
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'class="graph">{defs}{"".join(edges)}{"".join(parts)}</svg>'
    )


def arena_svg(buffers: list[tuple], n_steps: int, stats: dict) -> str:
    """Each tensor a rectangle over its live steps (x) at its arena offset (y)."""
    arena, low = max(stats["arena_bytes"], 1), stats["lower_bound_bytes"]
    left, top, plot_h = 80, 20, 420
    step_w = max(6.0, min(40.0, 1100 / max(n_steps + 1, 1)))
    plot_w = step_w * (n_steps + 1)
    width, height = left + plot_w + 200, top + plot_h + 50

    def ys(b: float) -> float:
        return top + plot_h - b / arena * plot_h

    parts = [
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot"/>',
    ]
    for i, (name, size, first, last, off) in enumerate(buffers):
        hue = (i * 47) % 360
        x, w = left + first * step_w, (last - first + 1) * step_w
        y0, y1 = ys(off + size), ys(off)
        parts.append(
            f'<rect x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{max(y1 - y0, 0.8):.1f}" '
            f'fill="hsl({hue},60%,70%)" class="buf"><title>{_esc(name)}: {size:,} B, '
            f"steps {first}-{last}, offset {off:,}</title></rect>"
        )
    live = [0] * (n_steps + 1)
    for _, size, first, last, _ in buffers:
        for s in range(first, min(last, n_steps) + 1):
            live[s] += size
    pts = " ".join(
        f"{left + s * step_w:.1f},{ys(v):.1f} {left + (s + 1) * step_w:.1f},{ys(v):.1f}"
        for s, v in enumerate(live)
    )
    parts.append(f'<polyline points="{pts}" class="live"/>')
    for value, cls, label in ((arena, "arena", "arena"), (low, "low", "lower bound")):
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{ys(value):.1f}" y2="{ys(value):.1f}" '
            f'class="{cls}"/><text x="{left + plot_w + 6}" y="{ys(value) + (12 if cls == "low" else -2):.1f}" '
            f'class="{cls}t">{label} {_mib(value)}</text>'
        )
    for k in range(5):
        b = arena * k / 4
        parts.append(
            f'<text x="{left - 6}" y="{ys(b) + 4:.1f}" text-anchor="end" class="tick">'
            f"{b / MiB:.1f} MiB</text>"
        )
    every = max(1, round(n_steps / 12 / 5) * 5) if n_steps > 12 else 1
    for s in range(0, n_steps + 1, every):
        parts.append(
            f'<text x="{left + (s + 0.5) * step_w:.1f}" y="{top + plot_h + 16}" '
            f'text-anchor="middle" class="tick">{s}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 36}" text-anchor="middle" '
        'class="tick">step (launch index); black line: bytes live at each step</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height}" '
        f'class="timeline">{"".join(parts)}</svg>'
    )


CSS = """
body{font:14px system-ui,sans-serif;margin:24px;color:#223}
.row{display:flex;gap:40px;align-items:flex-start}
h1{font-size:20px} h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse} td,th{border:1px solid #ccd;padding:2px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.scroll{overflow:auto;max-height:85vh;border:1px solid #ccd;background:#fcfcfd}
svg text{font:11px ui-monospace,monospace;fill:#223} svg .head{font-weight:bold}
svg .sub{fill:#556} svg .dim{fill:#778} svg .mem{font-size:10.5px}
.box{stroke:#556;stroke-width:1} .io{fill:#fff;stroke:#556}
.edge{fill:none;stroke:#667;stroke-width:1.2}
.plot{fill:#fff;stroke:#99a} .buf{stroke:#334;stroke-width:.4}
.live{fill:none;stroke:#000;stroke-width:1.2}
pre{font:11px ui-monospace,monospace;max-height:40em;overflow:auto;background:#f6f6f8}
.arena{stroke:#c22;stroke-width:1.5} .low{stroke:#26c;stroke-width:1.5;stroke-dasharray:6 4}
svg .arenat{fill:#c22} svg .lowt{fill:#26c} svg .tick{fill:#556}
"""


def _fmt(v: object) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def html_page(model: Any, title: str = "pyforge explain") -> str:
    """The self-contained page: stats, passes, graph SVG, arena SVG, groups and buffers."""
    d, stats = model.details, model.stats
    gs = groups(model)
    stat_rows = "".join(
        f"<tr><th>{_esc(k)}</th><td class=n>{_esc(_fmt(v))}</td></tr>" for k, v in stats.items()
    )
    pass_rows = "".join(
        f"<tr><td>{_esc(n)}</td><td class=n>{c}</td></tr>" for n, c in d["pass_ops"]
    )
    buf_rows = "".join(
        f"<tr><td>{_esc(n)}</td><td class=n>{s:,}</td><td class=n>{a}-{b}</td>"
        f"<td class=n>{o:,}</td></tr>"
        for n, s, a, b, o in sorted(d["buffers"], key=lambda b: (b[2], b[4]))
    )
    step_rows = "".join(
        f"<tr><td class=n>{i}</td><td>{_esc(what)}</td><td>{_esc(label)}</td><td>{_esc(how)}"
        + (
            f"<details><summary>{_esc(path)}</summary><pre>{_esc(_source(path))}</pre></details>"
            if path
            else ""
        )
        + "</td></tr>"
        for i, what, label, how, path in step_lines(model)
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{_esc(title)}</title><style>{CSS}</style></head>
<body><h1>{_esc(title)}</h1>
<p>{stats["ops_in"]} ONNX ops &rarr; {stats["ops_out"]} nodes ({stats.get("groups", "?")} fused
groups), {stats["launches"]} launches per inference on {_esc(model.target)}.
{_esc(memory_summary(stats))}.</p>
<div class="row"><div><h2>Stats</h2><table>{stat_rows}</table></div>
<div><h2>Ops after each pass</h2><table><tr><th>pass</th><th>ops</th></tr>{pass_rows}</table>
</div></div>
<h2>Arena timeline (each tensor a rectangle: live steps &times; arena offset)</h2>
<div class="scroll">{arena_svg(d["buffers"], len(model.plan.steps), stats)}</div>
<h2>Optimised graph ({len(gs)} nodes; hover a box for its members and steps)</h2>
<p>Box colour: <span style="background:#dbe8ff">conv</span>
<span style="background:#eadcff">GEMM / MatMul</span> <span style="background:#dff3e0">pool</span>
<span style="background:#fff1cc">elementwise only</span> <span style="background:#eee">other</span>.
Each box is one fused group: its anchor op, output shape, plan steps, then its member ops.</p>
<div class="scroll">{graph_svg(gs)}</div>
<h2>Steps and generated kernels</h2>
<table><tr><th>step</th><th>part</th><th>label</th><th>run by (click for the source)</th></tr>
{step_rows}</table>
<h2>Memory plan</h2>
<table><tr><th>tensor</th><th>bytes</th><th>live steps</th><th>offset</th></tr>{buf_rows}</table>
</body></html>
"""


def write_html(model: Any, path: str, title: str = "pyforge explain") -> None:
    """Write ``html_page(model)`` to ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(html_page(model, title))
