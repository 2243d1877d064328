"""The context-parallel schemes: what each rank of a group of d ranks sends, per size.

- ``ring``: every rank passes its key/value chunk around the ring, ``(d-1)/d`` of a sample's
  ring volume per rank over ``d-1`` steps.
- ``ulysses``: all-to-alls over the heads, ``1/d`` of a sample's all-to-all volume per rank, with
  ``d-1`` peers; the size must divide the attention heads per rank.
- ``hybrid``: Ulysses over ``u`` ranks inside ring over ``r = d/u`` (:mod:`optimizer.plan.sharding`
  gives the split): the ring moves the key/value slices of 1/u of the heads, ``(r-1)/d`` of the ring
  volume per rank over ``r-1`` steps, and the all-to-all ``1/d`` of the all-to-all volume (none when
  u = 1) with ``u-1`` peers. Any size is allowed (u = 1 is a ring).

The ring volume is ``comm.bytes_per_token`` (for Ulysses profiles that field is the all-to-all's);
a hybrid profile gives the all-to-all's as ``comm.ulysses_bytes_per_token``. Both volumes travel
at the group's span bandwidth, like every other message of the group.

The Ulysses width u of a hybrid group is a rule of the size and the batch (:func:`ulysses_width`), so
the tables, the verifier, the shards and the trainer agree on it: u divides both d and the heads per
rank, is at most a node's ranks (the all-to-all stays inside a node's worth of ranks), and among
those leaves the least communication unhidden over the batch's lengths: the ring's part may hide
behind attention (``comm.overlap_with_attention``), the all-to-all's never does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from optimizer.costs.profile import CostProfile
    from optimizer.problem.problem import Problem


WIDTH_LENGTHS = 33
"""The batch's lengths a hybrid group's Ulysses width is chosen on: all of them up to this many, else
this many quantiles (chosen, not measured: enough to follow the length distribution, cheap at any size)."""


def _exposed(profile: CostProfile, lengths: np.ndarray, d: int, u: int, intra: bool) -> float:
    """Seconds of communication a group of ``d`` ranks with Ulysses width ``u`` does not hide, summed
    over ``lengths`` (the formula of :mod:`optimizer.costs.profile`, without padding)."""
    r = d // u
    bw = profile.bandwidth(d, intra)
    ring = profile.bytes_per_token * lengths * ((r - 1) / d) / bw + (
        profile.messages_per_step * ((r - 1) + (u - 1)) + profile.messages_fixed
    ) * profile.latency(intra)
    if profile.overlap_with_attention:
        ring = np.maximum(0.0, ring - profile.quadratic * lengths * lengths / d)
    a2a = profile.ulysses_bytes_per_token * lengths / d / bw if u > 1 else 0.0
    return float(np.sum(ring + a2a))


def _width(profile: CostProfile, lengths: np.ndarray, d: int, heads: int, node: int) -> int:
    best, best_s = 1, _exposed(profile, lengths, d, 1, d <= node)
    for u in range(2, min(math.gcd(d, heads), node) + 1):
        if d % u or heads % u:
            continue
        exposed = _exposed(profile, lengths, d, u, d <= node)
        if exposed <= best_s * (1 + 1e-12):
            best, best_s = u, exposed
    return best


def heads_per_rank(problem: Problem) -> int:
    return problem.model.llm.heads // problem.cluster.tensor_parallel


def node_ranks(problem: Problem) -> int:
    return max(b - a for a, b in problem.cluster.node_rank_ranges)


def width_lengths(problem: Problem) -> np.ndarray:
    """The lengths the widths are chosen on (see :data:`WIDTH_LENGTHS`)."""
    lengths = np.asarray(problem.batch.lengths, dtype=np.float64)
    if lengths.shape[0] <= WIDTH_LENGTHS:
        return lengths
    return np.quantile(lengths, np.linspace(0.0, 1.0, WIDTH_LENGTHS))


def ulysses_width(problem: Problem, d: int) -> int:
    """The Ulysses width u of a group of ``d`` ranks: d under Ulysses, 1 under ring, and under hybrid the
    divisor of d and of the heads per rank, at most a node's ranks, that leaves the least communication
    unhidden over the batch's lengths (ties to the larger u)."""
    scheme = problem.scheme
    if scheme == "ring" or d == 1:
        return 1
    if scheme == "ulysses":
        return d
    memo = problem.ulysses_widths
    if d not in memo:
        if "lengths" not in memo:
            memo["lengths"] = width_lengths(problem)
        memo[d] = _width(problem.cost_profile, memo["lengths"], d, heads_per_rank(problem), node_ranks(problem))
    return int(memo[d])


@dataclass(frozen=True)
class Exchange:
    """Per allowed size: the share of a sample's ring (or Ulysses) volume each rank sends, the share
    of its all-to-all volume (hybrid only), and the message steps the latency is paid for."""

    share: np.ndarray
    a2a_share: np.ndarray
    steps: np.ndarray


def exchange(profile: CostProfile, sizes: np.ndarray, widths: np.ndarray) -> Exchange:
    """The :class:`Exchange` of ``sizes`` (float64) with Ulysses widths ``widths`` under ``profile``'s scheme."""
    d = np.asarray(sizes, dtype=np.float64)
    if profile.scheme == "ring":
        return Exchange((d - 1) / d, np.zeros_like(d), d - 1)
    if profile.scheme == "ulysses":
        return Exchange(1.0 / d, np.zeros_like(d), d - 1)
    u = np.asarray(widths, dtype=np.float64)
    r = d / u
    return Exchange((r - 1) / d, np.where(u > 1, 1.0 / d, 0.0), (r - 1) + (u - 1))


def pad_unit(profile: CostProfile) -> int:
    """Bytes are sent for the sample padded to a multiple of this times d (0: its own length)."""
    if not profile.padded_bytes:
        return 0
    return 1 if profile.scheme == "ulysses" else 2
