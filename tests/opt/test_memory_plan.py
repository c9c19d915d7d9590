import itertools

import numpy as np
import pytest

from pyforge.opt.memory_plan import (
    Buffer,
    check_no_overlap,
    exact_optimum,
    plan_memory,
)

# Worst arena / optimum seen over 12,000 instances (seeds 0-39 of `_random_instance`, 300 each)
# was 27/22 ~ 1.227, and the planner was optimal on >= 98.7% of every seed's 300. The seed used
# below gives a worst ratio of 12/11 and 297/300 optimal.
BOUND = 1.23
MIN_OPTIMAL_FRACTION = 0.98


def _random_instance(rng: np.random.Generator, max_n: int = 7) -> list[Buffer]:
    buffers = []
    for k in range(int(rng.integers(1, max_n + 1))):
        if rng.random() < 0.7:
            size = int(rng.integers(1, 9)) * 256
        else:
            size = int(rng.integers(1, 2049))
        start = int(rng.integers(0, 8))
        end = int(min(7, start + rng.integers(0, 5)))
        buffers.append(Buffer(k, size, start, end))
    return buffers


def _grid_optimum(buffers: list[Buffer], alignment: int = 256) -> int:
    """Exact optimum by trying every aligned offset tuple: independent of the greedy argument."""
    units = [-(-b.size // alignment) for b in buffers]
    naive = sum(units)
    pairs = [
        (i, j)
        for i, j in itertools.combinations(range(len(buffers)), 2)
        if buffers[i].start <= buffers[j].end and buffers[j].start <= buffers[i].end
    ]
    best = naive
    for offs in itertools.product(*(range(naive - u + 1) for u in units)):
        top = max(o + u for o, u in zip(offs, units))
        if top < best and all(
            offs[i] + units[i] <= offs[j] or offs[j] + units[j] <= offs[i] for i, j in pairs
        ):
            best = top
    return best * alignment


def test_planner_against_exact_optimum():
    rng = np.random.default_rng(0)
    optimal = 0
    for _ in range(300):
        buffers = _random_instance(rng)
        plan = plan_memory(buffers)
        check_no_overlap(buffers, plan.offsets)
        opt = exact_optimum(buffers)
        assert plan.lower_bound_bytes <= opt <= plan.arena_bytes <= plan.naive_bytes
        assert plan.arena_bytes <= opt * BOUND
        optimal += plan.arena_bytes == opt
    assert optimal / 300 >= MIN_OPTIMAL_FRACTION


def test_exact_optimum_matches_grid_search():
    rng = np.random.default_rng(1)
    for _ in range(150):
        buffers = [
            Buffer(b.key, min(b.size, 768), b.start, b.end) for b in _random_instance(rng, max_n=4)
        ]
        assert exact_optimum(buffers) == _grid_optimum(buffers)


def test_random_inplace_hints_stay_safe():
    rng = np.random.default_rng(2)
    reused = 0
    for _ in range(200):
        buffers = _random_instance(rng)
        hints = [
            (a.key, b.key)
            for a, b in itertools.permutations(buffers, 2)
            if a.end == b.start and -(-a.size // 256) == -(-b.size // 256)
        ]
        plan = plan_memory(buffers, inplace=hints)
        check_no_overlap(buffers, plan.offsets, inplace=hints)
        assert plan.lower_bound_bytes <= plan.arena_bytes <= plan.naive_bytes
        reused += plan.arena_bytes < exact_optimum(buffers)
    assert reused > 0


def test_large_graph_is_valid_and_near_lower_bound():
    rng = np.random.default_rng(3)
    starts = rng.integers(0, 250, 250)
    lengths = rng.geometric(0.2, 250)
    buffers = [
        Buffer(i, int(rng.integers(1, 1 << 20)), int(s), int(s + n))
        for i, (s, n) in enumerate(zip(starts, lengths))
    ]
    plan = plan_memory(buffers)
    check_no_overlap(buffers, plan.offsets)
    assert plan.lower_bound_bytes <= plan.arena_bytes <= 1.05 * plan.lower_bound_bytes


def test_check_no_overlap_catches_overlap():
    buffers = [Buffer("a", 512, 0, 2), Buffer("b", 512, 2, 3), Buffer("c", 256, 4, 5)]
    check_no_overlap(buffers, {"a": 0, "b": 512, "c": 0})
    with pytest.raises(ValueError, match="'a' and 'b'"):
        check_no_overlap(buffers, {"a": 0, "b": 256, "c": 0})
    with pytest.raises(ValueError, match="multiple of 256"):
        check_no_overlap(buffers, {"a": 0, "b": 512, "c": 128})


def test_check_no_overlap_inplace_pairs():
    buffers = [Buffer("src", 300, 0, 2), Buffer("dst", 500, 2, 3)]
    check_no_overlap(buffers, {"src": 0, "dst": 0}, inplace=[("src", "dst")])
    with pytest.raises(ValueError):
        check_no_overlap(buffers, {"src": 0, "dst": 0})
    # In-place means the exact same bytes; a shifted overlap would corrupt an elementwise kernel.
    with pytest.raises(ValueError):
        check_no_overlap(buffers, {"src": 0, "dst": 256}, inplace=[("src", "dst")])
    # Ineligible hints (lifetimes not back to back, or sizes differ) grant nothing.
    late = [Buffer("src", 256, 0, 2), Buffer("dst", 256, 1, 3)]
    with pytest.raises(ValueError):
        check_no_overlap(late, {"src": 0, "dst": 0}, inplace=[("src", "dst")])
    bigger = [Buffer("src", 256, 0, 2), Buffer("dst", 257, 2, 3)]
    with pytest.raises(ValueError):
        check_no_overlap(bigger, {"src": 0, "dst": 0}, inplace=[("src", "dst")])


def test_empty():
    plan = plan_memory([])
    assert (plan.offsets, plan.arena_bytes, plan.naive_bytes, plan.lower_bound_bytes) == (
        {},
        0,
        0,
        0,
    )
    assert exact_optimum([]) == 0


def test_single_buffer():
    plan = plan_memory([Buffer("x", 1000, 3, 3)])
    assert plan.offsets == {"x": 0}
    assert plan.arena_bytes == plan.naive_bytes == plan.lower_bound_bytes == 1024


def test_disjoint_intervals_share_one_slot():
    sizes = [256, 2048, 700, 1024]
    buffers = [Buffer(i, s, 2 * i, 2 * i + 1) for i, s in enumerate(sizes)]
    plan = plan_memory(buffers)
    assert set(plan.offsets.values()) == {0}
    assert plan.arena_bytes == plan.lower_bound_bytes == 2048


def test_all_overlapping_needs_naive():
    buffers = [Buffer(i, 256 * (i + 1), i, 10) for i in range(5)]
    plan = plan_memory(buffers)
    check_no_overlap(buffers, plan.offsets)
    assert plan.arena_bytes == plan.naive_bytes == plan.lower_bound_bytes == 256 * 15


def test_intervals_are_inclusive():
    buffers = [Buffer("a", 256, 0, 1), Buffer("b", 256, 1, 2)]
    assert plan_memory(buffers).arena_bytes == 512


def test_inplace_chain_uses_one_buffer():
    buffers = [Buffer(k, 1000, i, i + 1) for i, k in enumerate("abcd")]
    chain = [("a", "b"), ("b", "c"), ("c", "d")]
    plan = plan_memory(buffers, inplace=chain)
    check_no_overlap(buffers, plan.offsets, inplace=chain)
    assert set(plan.offsets.values()) == {0}
    assert plan.arena_bytes == plan.lower_bound_bytes == 1024
    assert plan_memory(buffers).arena_bytes == 2048


def test_inplace_reuse_around_a_long_lived_buffer():
    buffers = [
        Buffer("w", 512, 0, 4),
        Buffer("a", 256, 0, 2),
        Buffer("b", 256, 2, 4),
        Buffer("t", 768, 1, 1),
    ]
    hints = [("a", "b")]
    plan = plan_memory(buffers, inplace=hints)
    check_no_overlap(buffers, plan.offsets, inplace=hints)
    assert plan.offsets["a"] == plan.offsets["b"]
    assert plan.arena_bytes == 512 + 256 + 768


@pytest.mark.parametrize(
    ("alignment", "expected"),
    [(1, [1, 256, 257]), (64, [64, 256, 320]), (256, [256, 256, 512]), (4096, [4096] * 3)],
)
def test_alignment_rounding(alignment, expected):
    buffers = [Buffer(i, s, 0, 0) for i, s in enumerate([1, 256, 257])]
    plan = plan_memory(buffers, alignment=alignment)
    check_no_overlap(buffers, plan.offsets, alignment=alignment)
    assert plan.naive_bytes == plan.arena_bytes == plan.lower_bound_bytes == sum(expected)
    # All live at once, so the aligned slots must tile [0, arena) exactly.
    slots = sorted((plan.offsets[b.key], expected[b.key]) for b in buffers)
    assert [offset for offset, _ in slots] == [sum(n for _, n in slots[:i]) for i in range(3)]
    assert all(offset % alignment == 0 for offset, _ in slots)


def test_rejects_bad_buffers():
    with pytest.raises(ValueError):
        plan_memory([Buffer("x", 0, 0, 0)])
    with pytest.raises(ValueError):
        plan_memory([Buffer("x", 16, 3, 2)])
