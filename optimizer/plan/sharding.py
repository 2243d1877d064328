"""How a sample's tokens are split over the ranks of its group.

Ring attention uses the zig-zag split for causal balance: the sequence is padded to a multiple of
2d and cut into 2d equal chunks; the rank at position i holds chunks i and 2d-1-i, so every rank
gets one early (cheap) and one late (expensive) chunk. Ulysses splits contiguously (padded to a
multiple of d) because each rank later sees the whole sequence for its share of the heads.
Ranges are half-open ``[start, end)`` token offsets into the unpadded sample; a range that lies
wholly in the padding is empty (start == end).
"""

from __future__ import annotations


def padded_length(length: int, d: int, scheme: str = "ring") -> int:
    unit = 2 * d if scheme == "ring" else d
    return -(-length // unit) * unit


def token_ranges(length: int, d: int, scheme: str = "ring") -> list[list[tuple[int, int]]]:
    """For each position 0..d-1 in the group, the token ranges it holds."""
    if d == 1:
        return [[(0, length)]]
    total = padded_length(length, d, scheme)
    L = length
    if scheme == "ring":
        c = total // (2 * d)
        last = 2 * d
        return [
            [(min(i * c, L), min((i + 1) * c, L)), (min((last - 1 - i) * c, L), min((last - i) * c, L))]
            for i in range(d)
        ]
    c = total // d
    return [[(min(i * c, L), min((i + 1) * c, L))] for i in range(d)]


def tokens_held(length: int, d: int, scheme: str = "ring") -> list[int]:
    """Real (unpadded) tokens each position holds."""
    return [sum(b - a for a, b in rs) for rs in token_ranges(length, d, scheme)]
