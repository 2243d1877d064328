"""Which group sizes a plan may use: the one rule the tables, the planners and the verifier share.

A size d is allowed when it is at most the domain (and at most ``options.max_degree`` when the
caller sets one), a power of two under ``degree_policy = "pow2"``, a divisor of the attention heads
per rank under Ulysses (a hybrid group takes any size: :mod:`optimizer.costs.cp_schemes`), and, with
``group_reuse = "only"``, the size of an existing group (or 1).

Under ``degree_policy = "aligned"`` the rank sets themselves are fixed: the sizes are 1, the powers
of two from 2 to ``2^(floor(log2 N) - 1)`` (N/2 on a power-of-two domain of N ranks) and N itself,
and a group of size d < N holds the ranks ``k d .. k d + d - 1`` for some k (:func:`rank_set_problem`).
These are the process groups Megatron-Core creates for hybrid context parallelism
(``parallel_state.create_hybrid_dp_cp_groups``: aligned blocks of every power of two from 2 below
the domain's largest power of two, the whole data x context-parallel group, and a rank alone).

On large domains every size would make the cost tables (samples x sizes) too big to plan in
milliseconds, so the sizes are all integers up to :data:`DENSE_SIZES` and, above it, a ladder: whole
multiples of the node size growing by at most :data:`LADDER_STEP` from one to the next, and always
the largest size itself (the whole domain, or ``max_degree``). On the domains most jobs plan (up to
``DENSE_SIZES`` ranks) that is every integer size. Lower bounds and the verifier use the same sizes,
so a bound holds for every plan the verifier accepts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from optimizer.costs.profile import CostProfile
    from optimizer.problem.batch import Batch
    from optimizer.problem.cluster import Cluster
    from optimizer.problem.model import ModelSpec
    from optimizer.problem.options import PlanOptions


class Problem(Protocol):
    """What the size rules read of :class:`optimizer.problem.problem.Problem` (which computes its
    scheme from them, so this module does not import it)."""

    @property
    def cluster(self) -> Cluster: ...
    @property
    def model(self) -> ModelSpec: ...
    @property
    def batch(self) -> Batch: ...
    @property
    def options(self) -> PlanOptions: ...
    @property
    def profile(self) -> CostProfile | None: ...
    @property
    def existing_groups(self) -> tuple[tuple[int, ...], ...]: ...
    @property
    def scheme(self) -> str: ...


DENSE_SIZES = 64
"""Every integer size up to this one is allowed (when the other rules allow it)."""
LADDER_STEP = 1.125
"""Above DENSE_SIZES, consecutive allowed sizes differ by at most this factor (and at least one node)."""


def largest_size(problem: Problem) -> int:
    """The largest group size: the domain, or the caller's ``max_degree`` when smaller."""
    n = problem.cluster.domain_size
    cap = problem.options.max_degree
    return n if cap is None else min(n, cap)


def _node_size(problem: Problem) -> int:
    return max(b - a for a, b in problem.cluster.node_rank_ranges)


@cache
def _ladder(top: int, node: int) -> tuple[int, ...]:
    sizes: list[int] = []
    d = DENSE_SIZES
    while True:
        nxt = max(d + 1, math.floor(d * LADDER_STEP))
        nxt = max(node, (nxt // node) * node) if node > 1 else nxt  # whole nodes
        if nxt <= d:
            nxt = d + node
        if nxt >= top:
            break
        sizes.append(nxt)
        d = nxt
    return (*sizes, top)


def aligned_sizes(n: int) -> list[int]:
    """The sizes of the aligned blocks of a domain of ``n`` ranks, ascending (see the module docstring)."""
    below = [1 << k for k in range(1, n.bit_length() - 1)]
    return [1, *below, n] if n > 1 else [1]


def allowed_degrees(problem: Problem, scheme: str | None = None) -> list[int]:
    """Every allowed group size, ascending (see the module docstring), under ``scheme`` (default the problem's)."""
    top = largest_size(problem)
    if problem.options.degree_policy == "aligned":
        sizes = [d for d in aligned_sizes(problem.cluster.domain_size) if d <= top]
    elif problem.options.degree_policy == "pow2":
        sizes = [1 << k for k in range(top.bit_length()) if (1 << k) <= top]
    elif top <= DENSE_SIZES:
        sizes = list(range(1, top + 1))
    else:
        sizes = list(range(1, DENSE_SIZES + 1)) + list(_ladder(top, _node_size(problem)))
    if (scheme or problem.scheme) == "ulysses":
        heads = problem.model.llm.heads // problem.cluster.tensor_parallel
        sizes = [d for d in sizes if heads % d == 0]
    if problem.options.group_reuse == "only":
        have = {len(g) for g in problem.existing_groups}
        sizes = [d for d in sizes if d == 1 or d in have]
    return sizes


def size_problem(problem: Problem, d: int) -> str | None:
    """Why size ``d`` is not allowed, or None when it is."""
    n = problem.cluster.domain_size
    if d > n:
        return f"size {d} exceeds the domain of {n} ranks"
    opts = problem.options
    if opts.max_degree is not None and d > opts.max_degree:
        return f"size {d} exceeds options.max_degree {opts.max_degree}"
    if opts.degree_policy == "pow2" and d & (d - 1):
        return f"size {d} is not a power of two"
    if opts.degree_policy == "aligned" and d not in aligned_sizes(n):
        return (
            f"size {d} is not an aligned block size of the {n}-rank domain "
            f"(1, powers of two up to {aligned_sizes(n)[-2]}, or {n})"
        )
    if problem.scheme == "ulysses":
        heads = problem.model.llm.heads // problem.cluster.tensor_parallel
        if heads % d:
            return (
                f"size {d} does not divide the {heads} attention heads per rank (Ulysses; the hybrid scheme takes any "
                "size)"
            )
    if opts.degree_policy == "any" and d > DENSE_SIZES and d not in _ladder(largest_size(problem), _node_size(problem)):
        return (
            f"size {d} is not one of the sizes planned above {DENSE_SIZES} ranks (multiples of the node size, "
            "see optimizer.problem.degrees)"
        )
    return None


def rank_set_problem(problem: Problem, ranks: Sequence[int]) -> str | None:
    """Why the rank set ``ranks`` (of an allowed size) is not allowed, or None when it is: under
    ``degree_policy = "aligned"`` a group smaller than the domain must be an aligned block."""
    d = len(ranks)
    if problem.options.degree_policy != "aligned" or d == 1 or d == problem.cluster.domain_size:
        return None
    low = min(ranks)
    if low % d or max(ranks) - low != d - 1:
        return (
            f"ranks {low}..{max(ranks)} are not an aligned block of {d} (a group of {d} ranks starts at a multiple of "
            f"{d} and is contiguous)"
        )
    return None


def binding_rules(problem: Problem, need: int) -> list[tuple[str, str]]:
    """The rules that keep every allowed size below ``need`` ranks, each with the change that lifts it:
    (rule, fix) pairs; lifting them all allows a group of ``need`` ranks."""
    n = problem.cluster.domain_size
    if need > n:
        return [(f"the domain has {n} ranks", f"use at least {need} ranks in the data x context-parallel domain")]
    opts = problem.options
    out = []
    if opts.max_degree is not None and opts.max_degree < need:
        out.append((f"options.max_degree is {opts.max_degree}", f"raise options.max_degree to >= {need}"))
    if opts.degree_policy == "pow2" and 1 << (n.bit_length() - 1) < need:
        out.append(("options.degree_policy 'pow2' allows powers of two only", "set options.degree_policy to 'any'"))
    if problem.scheme == "ulysses":
        heads = problem.model.llm.heads // problem.cluster.tensor_parallel
        if max((d for d in range(1, n + 1) if heads % d == 0), default=1) < need:
            out.append(
                (
                    f"a Ulysses group must divide the {heads} attention heads per rank",
                    "set options.cp_scheme to 'hybrid' (Ulysses inside ring, any group size)",
                )
            )
    if opts.group_reuse == "only" and max((len(g) for g in problem.existing_groups), default=1) < need:
        out.append(
            ("options.group_reuse 'only' allows the existing groups' sizes", "set options.group_reuse to 'prefer'")
        )
    return out


def group_capacities(rank_capacity: np.ndarray, degrees: Sequence[int] | np.ndarray) -> np.ndarray:
    """The most tokens a group of each allowed size can hold: d times the capacity of the d-th
    roomiest rank (a group's tokens are split evenly, so its smallest member's capacity binds)."""
    roomiest = np.sort(np.asarray(rank_capacity, dtype=np.float64))[::-1]
    d = np.asarray(degrees, dtype=np.int64)
    d = d[d <= roomiest.shape[0]]
    return d * roomiest[d - 1] if d.shape[0] else np.zeros(1)


def ulysses_reach(problem: Problem) -> str | None:
    """Why no Ulysses group holds the longest sample of ``problem`` (its profile measured with
    Ulysses), or None when one does: the reason a plan runs hybrid instead."""
    profile = problem.profile
    assert profile is not None
    lengths = problem.batch.lengths
    if not lengths:
        return None
    names = [node.gpu.name for node in problem.cluster.nodes]
    capacity = np.array([profile.capacity_for(n) for n in names], dtype=np.float64)[list(problem.cluster.rank_node)]
    sizes = allowed_degrees(problem, "ulysses")
    longest = max(lengths)
    if sizes and longest <= float(group_capacities(capacity, sizes).max()) * (1 + 1e-9):
        return None
    if longest > float(group_capacities(capacity, allowed_degrees(problem, "hybrid")).max()) * (1 + 1e-9):
        return None  # no scheme holds it: the tables refuse the batch and say why
    need = math.ceil(longest / float(capacity.max()))
    heads = problem.model.llm.heads // problem.cluster.tensor_parallel
    return (
        f"the longest sample has {longest} tokens and needs a group of at least {need} ranks; a Ulysses group must "
        f"divide the {heads} attention heads per rank (largest: {max(sizes, default=1)}), so its groups run Ulysses "
        "inside ring"
    )
