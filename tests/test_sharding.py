from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optimizer.plan.sharding import padded_length, token_ranges, tokens_held


@given(st.integers(1, 50_000), st.integers(1, 16), st.sampled_from(["ring", "ulysses"]))
def test_ranges_cover_every_token_once(length, d, scheme):
    covered = sorted(r for rs in token_ranges(length, d, scheme) for r in rs if r[1] > r[0])
    pos = 0
    for a, b in covered:
        assert a == pos
        pos = b
    assert pos == length
    assert padded_length(length, d, scheme) % (2 * d if scheme == "ring" else d) == 0


def test_zigzag_layout_by_hand():
    # 16 tokens on 4 ranks: 8 chunks of 2; rank i holds chunks i and 7-i.
    assert token_ranges(16, 4) == [[(0, 2), (14, 16)], [(2, 4), (12, 14)], [(4, 6), (10, 12)], [(6, 8), (8, 10)]]
    # 10 tokens on 3 ranks: padded to 12, chunks of 2, the last chunk (10, 12) is padding.
    assert token_ranges(10, 3) == [[(0, 2), (10, 10)], [(2, 4), (8, 10)], [(4, 6), (6, 8)]]
    assert tokens_held(10, 3) == [2, 4, 4]


@pytest.mark.parametrize("d", [2, 3, 5, 6])
def test_zigzag_balances_causal_work(d):
    # Causal attention work of a token is proportional to its position: zig-zag pairs balance it.
    length = 2 * d * 100
    work = [sum(sum(range(a, b)) for a, b in rs) for rs in token_ranges(length, d)]
    assert max(work) / min(work) < 1.001
