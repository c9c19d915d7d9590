"""Run the README's examples on the small models and fail when one errors or its output's shape
has drifted from what the README shows.

    python scripts/check_readme.py [README.md]

- each ```python block runs in a fresh temporary directory; a bare expression followed by a
  comment that reads as a value (`model.inputs  # [TensorSpec(...)]`) must print that value;
- each `$ command` of a transcript block runs (bash, stdout and stderr together, one temporary
  directory per block) and every output line the README shows must appear in its output, in
  order, once numbers, hashes and directories are masked (timings and paths vary, the fields and
  words must not); commands naming resnet50 are skipped (minutes on a small CPU);
- each synopsis line (`    pyforge SUB ...`) names a subcommand whose --help lists its flags.
Exit code 0 when all hold, 1 otherwise (each failure printed).
"""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = re.compile(r"resnet50")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
SYNOPSIS = re.compile(r"^    (pyforge \w+ .*)$", re.MULTILINE)


def skeleton(line: str) -> str:
    """A line with what varies between runs masked: numbers, hashes, directories, spacing."""
    line = re.sub(r"[0-9a-f]{12,}", "H", line)
    line = re.sub(r"(?<![\w.])(?:~|\.{0,2})/?(?:[\w.+-]+/)+", "", line)  # dirs, keep basenames
    line = re.sub(r"[-+]?\d+(?:,\d{3})*(?:\.\d+)?(?:e[-+]?\d+)?", "#", line)
    line = re.sub(r"\s+", " ", line).strip()
    return re.sub(r"([\[(]) | ([\])])", r"\1\2", line)


def shims(bin_dir: Path) -> dict[str, str]:
    """`pyforge`, `python`, `python3` on PATH as this interpreter with this checkout's pyforge."""
    for name, args in (("pyforge", "-m pyforge.cli"), ("python", ""), ("python3", "")):
        (bin_dir / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" {args} "$@"\n')
        (bin_dir / name).chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    pypath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return dict(os.environ, PATH=path, PYTHONPATH=pypath, PYTHONUNBUFFERED="1")


def check_transcript(block: str, env: dict[str, str]) -> list[str]:
    """Run each `$ command` of one block in order in one directory; compare output skeletons."""
    problems, cmds = [], re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]
    with tempfile.TemporaryDirectory() as cwd:
        for chunk in cmds:
            cmd, _, shown = chunk.partition("\n")
            if SKIP.search(cmd):
                print(f"  skip   $ {cmd}")
                continue
            print(f"  run    $ {cmd}", flush=True)
            r = subprocess.run(
                ["bash", "-c", cmd],
                check=False,
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=300,
            )
            want = [skeleton(s) for s in shown.splitlines() if s.strip()]
            got = [skeleton(s) for s in r.stdout.splitlines()]
            if r.returncode != 0 and "exit $?" not in cmd:
                problems.append(f"$ {cmd}: exit {r.returncode}\n{r.stdout[-2000:]}")
                continue
            i = 0
            for w in want:
                while i < len(got) and got[i] != w:
                    i += 1
                if i == len(got):
                    problems.append(
                        f"$ {cmd}: README line not in the output (in order):\n    {w}\n"
                        f"  output:\n    " + "\n    ".join(got[-40:])
                    )
                    break
                i += 1
    return problems


def _comments(src: str) -> dict[int, str]:
    toks = tokenize.generate_tokens(io.StringIO(src).readline)
    return {t.start[0]: t.string[1:].strip() for t in toks if t.type == tokenize.COMMENT}


def check_python(src: str) -> list[str]:
    """Run one snippet statement by statement; a value comment after an expression must hold."""
    problems, comments, ns = [], _comments(src), {"__name__": "__readme__"}
    old_cwd, old_path = os.getcwd(), list(sys.path)
    with tempfile.TemporaryDirectory() as cwd:
        os.chdir(cwd)
        sys.path.insert(0, str(ROOT))
        try:
            for stmt in ast.parse(src).body:
                text = ast.get_source_segment(src, stmt)
                print(f"  run    {text.splitlines()[0]}", flush=True)
                try:
                    if isinstance(stmt, ast.Expr):
                        value = eval(compile(ast.Expression(stmt.value), "README", "eval"), ns)
                        shown = comments.get(stmt.end_lineno, "")
                        if shown and shown[0] in "[({'\"" and repr(value) != shown:
                            problems.append(f"{text}: README shows {shown}, got {value!r}")
                    else:
                        exec(compile(ast.Module([stmt], []), "README", "exec"), ns)  # noqa: S102
                except Exception as e:  # noqa: BLE001  (any error is the finding)
                    problems.append(f"{text}: {type(e).__name__}: {e}")
                    break
        finally:
            os.chdir(old_cwd)
            sys.path[:] = old_path
    return problems


def check_synopsis(line: str, env: dict[str, str]) -> list[str]:
    sub = line.split()[1]
    r = subprocess.run(
        ["pyforge", sub, "--help"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    missing = [f for f in re.findall(r"--[\w-]+", line) if f not in r.stdout]
    if r.returncode != 0 or missing:
        return [f"synopsis `{line}`: exit {r.returncode}, flags not in --help: {missing}"]
    return []


def main(argv: list[str]) -> int:
    readme = Path(argv[0]) if argv else ROOT / "README.md"
    text = readme.read_text()
    problems = []
    with tempfile.TemporaryDirectory() as bin_dir:
        env = shims(Path(bin_dir))
        for line in SYNOPSIS.findall(text):
            print(f"synopsis {line}", flush=True)
            problems += check_synopsis(line, env)
        for lang, block in FENCE.findall(text):
            if lang == "python":
                print("python block", flush=True)
                problems += check_python(block)
            elif re.search(r"^\$ ", block, re.MULTILINE):
                print("transcript block", flush=True)
                problems += check_transcript(block, env)
    for p in problems:
        print(f"\nREADME CHECK FAILED: {p}", file=sys.stderr)
    print(f"\n{readme.name}: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
