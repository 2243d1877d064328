"""How a sample's tokens are split over the ranks of its group.

Ring attention uses the zig-zag split for causal balance: the sequence is padded to a multiple of
2d and cut into 2d equal chunks; the rank at position i holds chunks i and 2d-1-i, so every rank
gets one early (cheap) and one late (expensive) chunk. Ulysses splits contiguously (padded to a
multiple of d) because each rank later sees the whole sequence for its share of the heads.

Hybrid (Ulysses over u ranks inside ring over r = d / u): the sequence is padded to a multiple of
2d and cut into 2r zig-zag chunks as for a ring of r; ring position i's two chunks are each split
into u equal contiguous pieces, and the rank at position ``p = i u + j`` holds piece j of chunk i
and piece j of chunk 2r-1-i. The u ranks ``i u .. i u + u - 1`` form ring position i's Ulysses
group (an all-to-all gives each of them both chunks for 1/u of the heads); the r ranks with the
same j form a ring. With u = 1 this is the ring split.

Ranges are half-open ``[start, end)`` token offsets into the unpadded sample; a range that lies
wholly in the padding is empty (start == end).
"""

from __future__ import annotations


def padded_length(length: int, d: int, scheme: str = "ring") -> int:
    unit = d if scheme == "ulysses" else 2 * d
    return -(-length // unit) * unit


def token_ranges(length: int, d: int, scheme: str = "ring", ulysses: int = 1) -> list[list[tuple[int, int]]]:
    """For each position 0..d-1 in the group, the token ranges it holds (``ulysses``: the Ulysses
    width u of a hybrid group; ignored by the other schemes)."""
    if d == 1:
        return [[(0, length)]]
    total = padded_length(length, d, scheme)
    L = length
    if scheme == "ulysses":
        c = total // d
        return [[(min(i * c, L), min((i + 1) * c, L))] for i in range(d)]
    u = ulysses if scheme == "hybrid" else 1
    if u < 1 or d % u:
        raise ValueError(f"the Ulysses width {u} must divide the group size {d}")
    r = d // u
    c = total // (2 * r)
    piece = c // u
    last = 2 * r
    out = []
    for p in range(d):
        i, j = divmod(p, u)
        early, late = i * c + j * piece, (last - 1 - i) * c + j * piece
        out.append([(min(early, L), min(early + piece, L)), (min(late, L), min(late + piece, L))])
    return out


def tokens_held(length: int, d: int, scheme: str = "ring", ulysses: int = 1) -> list[int]:
    """Real (unpadded) tokens each position holds."""
    return [sum(b - a for a, b in rs) for rs in token_ranges(length, d, scheme, ulysses)]
