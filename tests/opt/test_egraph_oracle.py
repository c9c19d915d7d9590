"""The oracle: random small e-graphs brute-forced in Python. Branch and bound must find the
brute-force optimum every time, and every lower bound it uses must be <= the true optimum of the
subproblem it bounds (the extensions of its partial choice)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pyforge.opt.egraph import EGraph, ENode, branch_and_bound, greedy


def random_egraph(rng: np.random.Generator, classes: int, extra: int):
    """Up to ``classes`` terms built bottom-up (hash-consed: a repeated term is its class), then
    up to ``extra`` alternative e-nodes over any classes, each merged into a random class (which
    can close cycles), rebuilt to congruence."""
    eg, ids = EGraph(), []
    for i in range(int(rng.integers(1, 3))):
        ids.append(eg.add(ENode("leaf", payload=i)))
    for _ in range(int(rng.integers(2, classes))):
        kids = tuple(int(k) for k in rng.choice(ids, size=int(rng.integers(1, 3))))
        ids.append(eg.add(ENode(f"op{int(rng.integers(0, 5))}", kids)))
    for _ in range(int(rng.integers(1, extra + 1))):
        kids = tuple(int(k) for k in rng.choice(ids, size=int(rng.integers(0, 3))))
        eg.union(eg.add(ENode(f"op{int(rng.integers(0, 5))}", kids)), int(rng.choice(ids)))
    eg.rebuild()
    prices = {f"op{i}": float(rng.integers(0, 10)) for i in range(5)}
    prices["leaf"] = float(rng.integers(0, 4))

    def cost(n: ENode) -> float:
        return prices[n.op] + (0.5 if n.payload == 1 else 0.0)

    return eg, eg.find(ids[-1]), cost


def brute_force(eg: EGraph, root: int, cost):
    """Every full choice (one e-node per class) and the cost of its extraction from ``root``
    (inf when it reaches a cycle), written independently of pyforge's extraction."""
    classes = sorted(eg.classes)
    nodes = [sorted(eg.classes[c], key=repr) for c in classes]
    col = {c: i for i, c in enumerate(classes)}
    picks = np.array(list(itertools.product(*(range(len(ns)) for ns in nodes))), dtype=np.int64)
    costs = np.array([_tree_cost(root, nodes, col, pick, cost) for pick in picks])
    return classes, nodes, col, picks, costs


def _tree_cost(root, nodes, col, pick, cost) -> float:
    on_path, done, total = set(), set(), 0.0

    def walk(c):
        nonlocal total
        if c in done:
            return True
        if c in on_path:
            return False
        on_path.add(c)
        n = nodes[col[c]][pick[col[c]]]
        ok = all(walk(ch) for ch in n.children)
        on_path.discard(c)
        done.add(c)
        total += cost(n)
        return ok

    return total if walk(root) else math.inf


def check(seed: int, classes: int, extra: int, max_choices: int) -> tuple[int, bool]:
    rng = np.random.default_rng(seed)
    eg, root, cost = random_egraph(rng, classes, extra)
    if math.prod(len(ns) for ns in eg.classes.values()) > max_choices:
        return 0, False
    classes, nodes, col, picks, costs = brute_force(eg, root, cost)
    bounds = []
    found = branch_and_bound(eg, root, cost, on_bound=lambda ch, lb: bounds.append((ch, lb)))
    assert found.log.optimal
    want = costs.min()
    assert found.cost == want, f"seed {seed}: branch and bound {found.cost}, brute force {want}"
    assert greedy(eg, cost) is not None
    assert found.log.greedy_cost >= want
    for partial, lb in bounds:
        mask = np.ones(len(picks), bool)
        for c, n in partial.items():
            mask &= picks[:, col[c]] == nodes[col[c]].index(n)
        sub = costs[mask].min() if mask.any() else math.inf
        assert lb <= sub + 1e-9, f"seed {seed}: bound {lb} > subproblem optimum {sub}"
    return len(bounds), found.log.greedy_cost > want


def run_oracle(instances: int, first_seed: int, classes: int, extra: int, max_choices: int):
    checked, bounds, beaten, seed = 0, 0, 0, first_seed
    while checked < instances:
        n, won = check(seed, classes, extra, max_choices)
        seed += 1
        checked += n > 0
        bounds += n
        beaten += won
    print(f"{checked} instances, {bounds} lower bounds checked, greedy beaten on {beaten}")
    return bounds, beaten


def test_oracle_500_instances_agree_and_bounds_hold():
    bounds, beaten = run_oracle(500, 0, classes=10, extra=8, max_choices=2_000)
    assert bounds > 500 and beaten > 0  # the search branched, and greedy alone was not enough


@pytest.mark.slow
def test_oracle_larger_instances():
    run_oracle(2_000, 100_000, classes=14, extra=14, max_choices=50_000)
