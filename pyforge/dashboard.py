"""asv results as one self-contained HTML page: inline SVG, no script, no external files.

    pyforge dashboard .asv -o dash.html

One chart per benchmark and parameter set, commits in date order along x. Every pyforge
benchmark is lower-is-better (seconds, launches, bytes, ops), so a point more than ``FACTOR``
above the previous commit's value on the same machine and environment is a regression: drawn red
and listed at the top (``asv continuous`` uses the same 10% threshold).
"""

from __future__ import annotations

import html
import itertools
import json
import math
from pathlib import Path

from .errors import ModelLoadError

FACTOR = 1.1
W, H, PAD = 350, 150, 34
CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#223} h1{font-size:20px}
h2{font-size:16px;margin-top:24px} .sub{color:#556;font-size:12px}
table{border-collapse:collapse} td,th{border:1px solid #ccd;padding:2px 8px;text-align:left}
svg text{font:10px ui-monospace,monospace;fill:#556}"""


def _esc(s: object) -> str:
    return html.escape(str(s), quote=True)


def load_results(root: str | Path) -> tuple[list[dict], dict]:
    """Result files (asv format 2) under ``root`` (``.asv`` or its ``results``) and benchmarks.json."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(2, "no such directory", str(root))
    base = root / "results" if (root / "results").is_dir() else root  # results/MACHINE/*.json
    bench_file = base / "benchmarks.json"
    meta = json.loads(bench_file.read_text()) if bench_file.is_file() else {}
    runs = []
    for f in sorted(base.glob("*/*.json")):
        if f.name == "machine.json":
            continue
        try:
            d = json.loads(f.read_text())
        except ValueError as e:
            raise ModelLoadError(f"{f}: not JSON ({e})") from e
        need = {"commit_hash", "results", "result_columns"}
        if not isinstance(d, dict) or not need <= set(d):
            raise ModelLoadError(f"{f}: not an asv result file (needs {sorted(need)})")
        d["machine"] = f.parent.name
        runs.append(d)
    if not runs:
        raise ModelLoadError(f"{root}: no asv results (run `asv run --set-commit-hash ...` first)")
    return runs, meta


def series(runs: list[dict]) -> tuple[list[tuple[str, int]], dict]:
    """Commits ``[(hash, date)]`` in date order and ``{(bench, params, where): {hash: value}}``."""
    commits, out = {}, {}
    for r in runs:
        commits[r["commit_hash"]] = r.get("date") or 0
        where = f"{r['machine']} / {r.get('env_name', '')}"
        col = r["result_columns"]
        for name, row in r["results"].items():
            got = dict(zip(col, row))
            values, params = got.get("result"), got.get("params") or []
            combos = [", ".join(c) for c in itertools.product(*params)] if params else [""]
            values = values if isinstance(values, list) else [values]
            for combo, v in zip(combos, values):
                if isinstance(v, (int, float)) and math.isfinite(v):
                    out.setdefault((name, combo, where), {})[r["commit_hash"]] = float(v)
    return sorted(commits.items(), key=lambda c: (c[1], c[0])), out


def regressions(order: list[str], points: dict[str, float]) -> list[tuple[str, float, float]]:
    """``(commit, before, after)`` wherever a value rose by more than FACTOR since the last one."""
    seen = [c for c in order if c in points]
    return [
        (b, points[a], points[b])
        for a, b in itertools.pairwise(seen)
        if points[b] > points[a] * FACTOR and points[b] - points[a] > 1e-12
    ]


def _fmt(v: float, unit: str) -> str:
    if unit == "seconds":
        for scale, u in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
            if v >= scale:
                return f"{v / scale:.3g} {u}"
        return f"{v * 1e9:.3g} ns"
    return f"{int(v):,} {unit}".strip() if v == int(v) else f"{v:,.4g} {unit}".strip()


def chart(order: list[str], points: dict[str, float], bad: set[str], unit: str) -> str:
    """One SVG: value over the commit axis shared by every chart; regressions red."""
    lo, hi = min(points.values()), max(points.values())
    top, bottom = _fmt(hi, unit), "" if hi == lo else _fmt(lo, unit)
    lo, hi = (lo - 1, hi + 1) if hi - lo < 1e-12 * abs(hi) + 1e-30 else (lo, hi)  # flat: mid
    step = (W - 2 * PAD) / max(len(order) - 1, 1)

    def xy(c: str) -> tuple[float, float]:
        x = PAD + step * order.index(c) if len(order) > 1 else W / 2
        return x, H - 22 - (points[c] - lo) / (hi - lo) * (H - 40)

    pts = [(c, *xy(c)) for c in order if c in points]
    parts = [
        f'<line x1="{PAD}" y1="{H - 22}" x2="{W - 8}" y2="{H - 22}" class="axis"/>',
        f'<text x="2" y="14" class="tick">{_esc(top)}</text>',
        f'<text x="2" y="{H - 26}" class="tick">{_esc(bottom)}</text>',
        '<polyline fill="none" stroke="#26c" stroke-width="1.5" points="'
        + " ".join(f"{x:.1f},{y:.1f}" for _, x, y in pts)
        + '"/>',
    ]
    for i, c in enumerate(order):
        x = PAD + step * i if len(order) > 1 else W / 2
        parts.append(
            f'<text x="{x:.1f}" y="{H - 6}" class="tick" text-anchor="middle">{c[:7]}</text>'
        )
    for c, x, y in pts:
        cls = "bad" if c in bad else "ok"
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{5 if c in bad else 3.5}" class="{cls}">'
            f"<title>{c[:8]}: {_esc(_fmt(points[c], unit))}</title></circle>"
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">{"".join(parts)}</svg>'
    )


def html_page(root: str | Path, title: str = "pyforge benchmarks") -> str:
    """The whole dashboard page for the asv results under ``root``."""
    runs, meta = load_results(root)
    commits, data = series(runs)
    order = [c for c, _ in commits]
    several = len({k[2] for k in data}) > 1
    found, charts = [], {}
    for (name, combo, where), points in sorted(data.items()):
        unit, names = meta.get(name, {}).get("unit", ""), meta.get(name, {}).get("param_names")
        if names and len(names) == combo.count(", ") + 1:
            combo = ", ".join(f"{k}={v}" for k, v in zip(names, combo.split(", ")))
        bad = regressions(order, points)
        found += [(name, combo, where, c, a, b, unit) for c, a, b in bad]
        label = f"{combo}  [{where}]" if several else combo
        charts.setdefault(name, []).append(
            f'<div class="card"><div class="sub">{_esc(label)}</div>'
            f"{chart(order, points, {c for c, _, _ in bad}, unit)}</div>"
        )
    rows = "".join(
        f"<tr><td>{_esc(n)}</td><td>{_esc(p)}</td><td>{c[:8]}</td><td>{_esc(_fmt(a, u))}</td>"
        f"<td>{_esc(_fmt(b, u))}</td><td>{b / a:.2f}x</td></tr>"
        for n, p, _, c, a, b, u in found
    )
    table = (
        f"<table><tr><th>benchmark</th><th>params</th><th>commit</th><th>before</th>"
        f"<th>after</th><th>ratio</th></tr>{rows}</table>"
        if found
        else "<p>none</p>"
    )
    sections = "".join(
        f'<h2>{_esc(n)}</h2><div class="grid">{"".join(cs)}</div>' for n, cs in charts.items()
    )
    span = f"{len(order)} commits, {len(data)} series, {len(runs)} result files"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>{CSS}
.grid{{display:flex;flex-wrap:wrap;gap:10px}} .card{{border:1px solid #ccd;padding:4px}}
svg .axis{{stroke:#99a}} svg .ok{{fill:#26c}} svg .bad{{fill:#c22}}
</style></head><body><h1>{_esc(title)}</h1><p class="sub">{span}; a red point is more than
{FACTOR - 1:.0%} above the commit before it.</p><h2>regressions</h2>{table}{sections}
</body></html>"""


def write_html(root: str | Path, path: str | Path) -> None:
    Path(path).write_text(html_page(root))
