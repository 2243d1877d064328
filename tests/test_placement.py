"""The compiled placement against a plain reference implementation of the same rules."""

from __future__ import annotations

import random

import pytest

from optimizer.heuristic.placement import place_groups


def reference_place(
    sizes: list[int], node_ranges: list[tuple[int, int]]
) -> tuple[list[tuple[int, ...]] | None, list[int]]:
    """Best fit by (fewest free ranks, lowest node); larger-than-node groups on runs of whole nodes; spill
    from the freest nodes."""
    free_start = [a for a, _ in node_ranges]
    ends = [b for _, b in node_ranges]
    if sum(sizes) > sum(b - a for a, b in node_ranges):
        return None, []
    node_size = max(b - a for a, b in node_ranges)
    placed: list[tuple[int, ...] | None] = [None] * len(sizes)
    spill = []
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        d = sizes[k]
        if d <= node_size:
            fits = [(ends[n] - free_start[n], n) for n in range(len(ends)) if ends[n] - free_start[n] >= d]
            if not fits:
                spill.append(k)
                continue
            _, n = min(fits)
            placed[k] = tuple(range(free_start[n], free_start[n] + d))
            free_start[n] += d
            continue
        run = None
        for start in range(len(ends)):
            if free_start[start] != node_ranges[start][0]:
                continue
            got, n = 0, start
            while n < len(ends):
                got += ends[n] - free_start[n]
                if got >= d:
                    run = start
                    break
                if free_start[n] != node_ranges[n][0]:
                    break
                n += 1
            if run is not None:
                break
        if run is None:
            spill.append(k)
            continue
        ranks: list[int] = []
        n = run
        while len(ranks) < d:
            take = min(d - len(ranks), ends[n] - free_start[n])
            ranks.extend(range(free_start[n], free_start[n] + take))
            free_start[n] += take
            n += 1
        placed[k] = tuple(ranks)
    for k in spill:
        ranks = []
        for n in sorted(range(len(ends)), key=lambda n: -(ends[n] - free_start[n])):
            take = min(sizes[k] - len(ranks), ends[n] - free_start[n])
            ranks.extend(range(free_start[n], free_start[n] + take))
            free_start[n] += take
            if len(ranks) == sizes[k]:
                break
        placed[k] = tuple(sorted(ranks))
    free = [r for n in range(len(ends)) for r in range(free_start[n], ends[n])]
    return [p for p in placed if p is not None], free


@pytest.mark.parametrize("seed", range(60))
def test_placement_matches_reference(seed: int) -> None:
    rng = random.Random(seed)
    per_node = [rng.choice([2, 4, 8]) if seed % 3 == 0 else 8 for _ in range(rng.randint(1, 12))]
    ranges, start = [], 0
    for size in per_node:
        ranges.append((start, start + size))
        start += size
    sizes = []
    while sum(sizes) < start * rng.uniform(0.3, 1.0):
        sizes.append(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24]))
    got = place_groups(sizes, ranges)
    want = reference_place(sizes, ranges)
    assert got == want
    if got[0] is not None:
        used = [r for g in got[0] for r in g] + got[1]
        assert sorted(used) == list(range(start))


def test_placement_refuses_too_many_ranks() -> None:
    assert place_groups([8, 8, 1], [(0, 8), (8, 16)]) == (None, [])
