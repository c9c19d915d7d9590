"""Print pyforge's size per layer and fail above a ceiling, so dead code gets deleted.

Counts non-blank lines of pyforge/**/*.py. Raise CEILING only in the commit that needs it,
saying why in the message.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# 8.6k at the P6 refactor; 13.7k after P7/P8 (symbolic shapes, control flow, quantised and contrib
# ops, staging). Raised to 20k on 2026-12-01 for three new subsystems: generate/ (GGUF decoders,
# the KV-cache runtime), serve/ (Ray Serve) and opt/egraph/ (equality saturation, branch and bound)
CEILING = 20_000


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "pyforge"
    per_layer: Counter[str] = Counter()
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        layer = rel.parts[0] if len(rel.parts) > 1 else "face"
        per_layer[layer] += sum(1 for line in path.read_text().splitlines() if line.strip())
    total = sum(per_layer.values())
    print("  ".join(f"{k} {v}" for k, v in sorted(per_layer.items())))
    print(f"pyforge: {total} non-blank lines (ceiling {CEILING})")
    if total > CEILING:
        print(f"over the ceiling by {total - CEILING}: delete dead code, or raise it with a reason")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
