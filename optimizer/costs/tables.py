"""Cost tables: per-sample times for every allowed group size, and the rules they come from.

Planners and formulations read :class:`CostTables`; they never see the model or the hardware.
:func:`sample_time` is the scalar form of the formula (documented in :mod:`optimizer.costs.profile`),
used by the verifier; the tables fill whole matrices with the same formula in compiled loops
(:mod:`optimizer.costs.time_kernels`), so the two paths check each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from optimizer.costs.cp_schemes import exchange, pad_unit, ulysses_width
from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.costs.time_kernels import fill_best_columns, fill_best_time, fill_time_matrices
from optimizer.errors import InfeasibleError
from optimizer.plan.sharding import padded_length
from optimizer.problem.batch import Batch, Sample
from optimizer.problem.degrees import allowed_degrees, binding_rules, group_capacities
from optimizer.problem.problem import Problem

UNFIT_S = 1e9
"""Seconds a sample is charged on a group too small to hold it, under ``options.memory = "sample"``
(each sample alone must fit: its length over the group's size within a rank's capacity). There the
tables' per-rank capacity does not bind (a rank runs its samples one after another), so this charge
is what keeps a sample off the sizes it does not fit: every planner minimises time, none keeps such
a placement, and the verifier, which checks the memory rule itself, refuses any plan that did."""


def vision_work(profile: CostProfile, sample: Sample) -> float:
    """Vision-encoder seconds of one sample on one rank (before splitting over the group)."""
    return sum(
        im.frames * (profile.vision_linear * im.tokens + profile.vision_quadratic * im.tokens * im.tokens)
        for im in sample.images
    )


def sample_time(
    profile: CostProfile, length: int, vision: float, d: int, intra: bool, speed: float = 1.0, ulysses: int = 1
) -> float:
    """Seconds one sample of ``length`` tokens adds to a group of size ``d`` (``ulysses``: a hybrid
    group's Ulysses width, :func:`optimizer.costs.cp_schemes.ulysses_width`)."""
    attention = profile.quadratic * length * length / d / speed
    compute = (
        profile.quadratic * length * length + profile.linear * length + vision
    ) / d / speed + profile.sample_constant / speed
    if d == 1:
        return compute
    compute += profile.sample_step * (d - 1) / speed
    bw = profile.bandwidth(d, intra)
    ex = exchange(profile, np.array([d], dtype=np.float64), np.array([ulysses], dtype=np.float64))
    share, a2a_share, steps = float(ex.share[0]), float(ex.a2a_share[0]), float(ex.steps[0])
    sent = padded_length(length, d, profile.scheme) if profile.padded_bytes else length
    comm = profile.bytes_per_token * sent * share / bw + (
        profile.messages_per_step * steps + profile.messages_fixed
    ) * profile.latency(intra)
    if profile.overlap_with_attention:
        comm = max(0.0, comm - attention)
    if profile.ulysses_bytes_per_token > 0.0:
        comm += profile.ulysses_bytes_per_token * sent * a2a_share / bw
    return compute + comm


def vision_work_array(profile: CostProfile, batch: Batch) -> np.ndarray:
    """:func:`vision_work` of every sample, as an array (the same sums, image by image in order)."""
    n = len(batch)
    if not (profile.vision_linear or profile.vision_quadratic):
        return np.zeros(n)
    images = batch.images
    tokens, frames = images.tokens.astype(np.float64), images.frames.astype(np.float64)
    work = frames * (profile.vision_linear * tokens + profile.vision_quadratic * tokens * tokens)
    counts = images.counts
    if work.shape[0] == n and n and counts.min() == 1:
        return work
    # bincount adds each sample's images in order, starting from zero, as the scalar sum does.
    return np.bincount(np.repeat(np.arange(n), counts), weights=work, minlength=n)


def bandwidths(bandwidth: Bandwidth, sizes: np.ndarray) -> np.ndarray:
    """:meth:`Bandwidth.at` of every size (the same search, by ``searchsorted``)."""
    values = np.asarray(bandwidth.values, dtype=np.float64)
    at = np.searchsorted(np.asarray(bandwidth.sizes, dtype=np.int64), sizes, side="left")
    return values[np.minimum(at, values.shape[0] - 1)]


@dataclass(frozen=True)
class CostTables:
    """Everything planners need, as arrays. Built once per problem by :meth:`build`."""

    problem: Problem
    profile: CostProfile
    lengths: np.ndarray  # int64 [n]
    vision: np.ndarray  # float64 [n], vision seconds on one rank
    degrees: np.ndarray  # int64 [D], ascending, allowed group sizes
    rank_node: np.ndarray  # int64 [N]
    rank_speed: np.ndarray  # float64 [N]
    rank_capacity: np.ndarray  # float64 [N], tokens a rank holds in one micro-batch (unbounded under the sample rule)
    node_ranges: tuple[tuple[int, int], ...]
    group_constant: float
    sample_capacity: np.ndarray  # float64 [N], tokens of one sample a rank holds (its capacity)

    @classmethod
    def build(cls, problem: Problem) -> CostTables:
        profile = problem.cost_profile
        cluster = problem.cluster
        samples = problem.batch.samples
        lengths = np.fromiter(problem.batch.lengths, dtype=np.int64, count=len(samples))
        vision = vision_work_array(profile, problem.batch)
        rank_node = np.asarray(cluster.rank_node, dtype=np.int64)
        gpu_names = [n.gpu.name for n in cluster.nodes]
        rank_speed = np.array([profile.speed_for(g) for g in gpu_names], dtype=np.float64)[rank_node]
        rank_capacity = np.array([profile.capacity_for(g) for g in gpu_names], dtype=np.float64)[rank_node]
        best_capacity = float(rank_capacity.max())
        need = int(math.ceil(int(lengths.max()) / best_capacity))
        degrees = allowed_degrees(problem)
        # The longest sample must fit on some allowed group size: a group's tokens are split evenly
        # over its ranks, so a group of size d holds at most d times the capacity of its d-th roomiest rank.
        holds = group_capacities(rank_capacity, degrees)
        if int(lengths.max()) > float(holds.max()) * (1 + 1e-9):
            worst = problem.batch.samples[int(lengths.argmax())]
            uniform = float(rank_capacity.min()) == best_capacity
            rules = binding_rules(problem, need)
            if uniform:
                message = (
                    f"sample {worst.id!r} has {worst.length} tokens and needs a group of at least {need} ranks "
                    f"({best_capacity:.0f} tokens per rank), but the largest allowed group size is {max(degrees)}"
                    + (": " + "; ".join(rule for rule, _ in rules) if rules else "")
                )
            else:
                d = int(degrees[int(holds.argmax())])
                message = (
                    f"sample {worst.id!r} has {worst.length} tokens, but no allowed group holds it: "
                    "a sample is split evenly over its group, so a group of d ranks holds at most d times its "
                    "smallest rank's capacity; the most any group holds is "
                    f"{float(holds.max()):.0f} tokens ({d} ranks; the largest allowed size is {max(degrees)}, "
                    f"{int((rank_capacity == best_capacity).sum())} ranks hold {best_capacity:.0f} tokens each)"
                )
            raise InfeasibleError(
                message,
                field="batch.samples",
                hint=(
                    " and ".join(fix for _, fix in rules) + ", or shorten the sample."
                    if uniform and rules
                    else "shorten the sample, or send a profile that holds more tokens per rank."
                    if uniform
                    else "add ranks of the roomiest GPU type, raise options.max_degree, enable recomputation, "
                    "or shorten the sample."
                ),
            )
        sample_capacity = rank_capacity
        if problem.options.memory == "sample":
            # A rank runs its samples one after another and holds one at a time: the tokens of a
            # micro-batch never bind (the batch's whole token count stands for "unbounded"), and each
            # sample keeps to the sizes it fits alone through UNFIT_S in the time matrices.
            rank_capacity = np.full_like(rank_capacity, max(float(lengths.sum()) + 1.0, best_capacity))
        return cls(
            problem=problem,
            profile=profile,
            lengths=lengths,
            vision=vision,
            degrees=np.asarray(degrees, dtype=np.int64),
            rank_node=rank_node,
            rank_speed=rank_speed,
            rank_capacity=rank_capacity,
            node_ranges=cluster.node_rank_ranges,
            group_constant=profile.group_constant,
            sample_capacity=sample_capacity,
        )

    def subset(self, rows: np.ndarray, **options: Any) -> CostTables:
        """The tables of the samples ``rows`` alone (same cluster, sizes and options): rows of the
        matrices already built are reused. Sample ``k`` of the subset is sample ``rows[k]`` here.
        ``options`` replace planner options of the subset's problem (e.g. ``max_micro_batches``)."""
        from dataclasses import replace

        from optimizer.problem.batch import Batch

        samples = self.problem.batch.samples
        sub = Batch.__new__(Batch)
        object.__setattr__(sub, "samples", tuple(samples[i] for i in rows.tolist()))
        problem = replace(self.problem, batch=sub)
        if options:
            problem = replace(problem, options=replace(problem.options, **options))
        # A hybrid group's Ulysses width is chosen on the whole batch; the subset keeps it.
        problem.__dict__["ulysses_widths"] = self.problem.ulysses_widths
        out = replace(self, problem=problem, lengths=self.lengths[rows], vision=self.vision[rows])
        out._matrices.update({key: m[rows] for key, m in self._matrices.items()})
        return out

    def rebuilt(self, **options: Any) -> CostTables:
        """The tables of the same batch built again with ``options`` replacing planner options (e.g. a smaller
        ``max_degree``: the sizes, and so the matrices, change). The hybrid groups' Ulysses widths stay those
        chosen here, as in :meth:`subset`."""
        from dataclasses import replace

        problem = replace(self.problem, options=replace(self.problem.options, **options))
        problem.__dict__["ulysses_widths"] = self.problem.ulysses_widths
        return CostTables.build(problem)

    @cached_property
    def for_bounds(self) -> CostTables:
        """The tables lower bounds read: these, except under the sample rule on ranks of different
        capacities, where a sample is charged UNFIT_S only on the sizes that cannot hold it even at
        the roomiest rank's capacity (a plan may put it on roomy ranks; planners judge fit at the
        smallest capacity, which every rank has)."""
        cap = self.sample_capacity
        if self.problem.options.memory != "sample" or float(cap.min()) == float(cap.max()):
            return self
        from dataclasses import replace

        return replace(self, sample_capacity=np.full_like(cap, float(cap.max())))

    # -- sizes --------------------------------------------------------------------------------
    @property
    def n_samples(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def n_ranks(self) -> int:
        return int(self.rank_node.shape[0])

    @cached_property
    def node_size(self) -> int:
        """Ranks of the largest node (groups up to this size can stay inside one node)."""
        return max(b - a for a, b in self.node_ranges)

    @cached_property
    def homogeneous(self) -> bool:
        return bool(
            np.all(self.rank_speed == self.rank_speed[0]) and np.all(self.rank_capacity == self.rank_capacity[0])
        )

    @cached_property
    def ulysses_widths(self) -> np.ndarray:
        """[D] the Ulysses width of each allowed size (1 under ring, d under Ulysses; see
        :func:`optimizer.costs.cp_schemes.ulysses_width`)."""
        return np.array([ulysses_width(self.problem, int(d)) for d in self.degrees.tolist()], dtype=np.int64)

    @cached_property
    def degree_index(self) -> dict[int, int]:
        return {int(d): j for j, d in enumerate(self.degrees)}

    # -- times --------------------------------------------------------------------------------
    def time_matrix(self, intra: bool, speed: float = 1.0) -> np.ndarray:
        """[n, D] seconds each sample adds to a group of each allowed size (spanning or not; a size
        wider than every node has its spanning times in both)."""
        key = (bool(intra), float(speed))
        cache = self._matrices
        if key not in cache:
            cache[(False, key[1])], cache[(True, key[1])] = self._compute_matrices(key[1])
        return cache[key]

    @cached_property
    def _matrices(self) -> dict[tuple[bool, float], np.ndarray]:
        return {}

    def _compute_matrices(self, speed: float) -> tuple[np.ndarray, np.ndarray]:
        """The time matrices across nodes and within one, at ``speed``, in one pass."""
        p = self.profile
        d = self.degrees.astype(np.float64)
        ex = exchange(p, d, self.ulysses_widths)
        fits = self.degrees <= self.node_size
        # A size wider than every node spans nodes whichever matrix asks: it gets the links across.
        bw = bandwidths(p.inter_bandwidth, self.degrees)
        intra_bw = np.where(fits, bandwidths(p.intra_bandwidth, self.degrees), bw)
        messages = p.messages_per_step * ex.steps + p.messages_fixed
        intra_latency = np.where(fits, messages * p.latency(True), messages * p.latency(False))
        out = np.empty((self.n_samples, d.shape[0]))
        intra_out = np.empty_like(out)
        fill_time_matrices(
            self.lengths,
            self.vision,
            d,
            ex.share,
            ex.a2a_share,
            bw,
            messages * p.latency(False),
            intra_bw,
            intra_latency,
            float(p.quadratic),
            float(p.linear),
            float(p.sample_constant),
            float(p.bytes_per_token),
            float(p.ulysses_bytes_per_token),
            float(speed),
            bool(p.overlap_with_attention),
            float(p.sample_step),
            pad_unit(p),
            out,
            intra_out,
        )
        if self.problem.options.memory == "sample":
            # Sizes below the first that holds the sample alone, at the capacity every rank has.
            first = np.searchsorted(float(self.sample_capacity.min()) * self.degrees, self.lengths, side="left")
            unfit = np.arange(d.shape[0])[None, :] < first[:, None]
            out[unfit] = UNFIT_S
            intra_out[unfit] = UNFIT_S
        return out, intra_out

    def prepare(self) -> int:
        """Build the time matrices every plan reads: both placements on the slowest GPU (what the
        heuristic charges) and on the fastest (what the lower bounds charge); one speed on a cluster of
        one GPU type. Returns the number of matrix cells (samples x sizes) built here."""
        built = 0
        for speed in sorted({float(self.rank_speed.min()), float(self.rank_speed.max())}):
            if (True, speed) not in self._matrices:
                self.time_matrix(True, speed)  # both placements at once (_compute_matrices)
                built += 2 * self.n_samples * int(self.degrees.shape[0])
        return built

    # -- per-group constants ------------------------------------------------------------------
    def group_constants(self, intra: bool) -> np.ndarray:
        """[D] seconds a group of each allowed size adds once per micro-batch: the group constant b
        plus its messages' latency G(d) (the same b for every size when the profile has no
        ``comm.group_messages``)."""
        return self._group_constants[1 if intra else 0]

    @cached_property
    def _group_constants(self) -> tuple[np.ndarray, np.ndarray]:
        p = self.profile
        b = self.group_constant
        d = self.degrees
        # CostProfile.group_messages and group_exchange_time over every size at once (the same operations).
        messages = np.where(d == 1, 0.0, p.group_messages_per_step * (d - 1) + p.group_messages_fixed)
        return b + messages * p.latency(False), b + messages * p.latency(True)

    @cached_property
    def best_group_constants(self) -> np.ndarray:
        """[D] the least group constant of each size over its placements (intra-node where the size fits a node)."""
        inter, intra = self._group_constants
        return np.where((self.degrees <= self.node_size) & (intra < inter), intra, inter)

    @cached_property
    def placed_group_constants(self) -> np.ndarray:
        """[D] the group constant of each size placed as the heuristic places it: within a node up to
        the node size, across nodes above."""
        inter, intra = self._group_constants
        return np.where(self.degrees <= self.node_size, intra, inter)

    @property
    def varying_group_constant(self) -> bool:
        """Whether the group constant depends on the group's size or span (``comm.group_messages``)."""
        return self.profile.has_group_exchange

    @cached_property
    def intra_never_slower(self) -> bool:
        """Whether no sample is slower within a node than across nodes, on any size: the links within a
        node are at least as fast and no slower to start on every size that fits one (a sample's
        message time grows with the latency and falls with the bandwidth). Then the intra-node matrix is
        the best placement of every size (wider sizes hold their spanning times there)."""
        p = self.profile
        fitting = self.degrees[self.degrees <= self.node_size]
        return p.latency(True) <= p.latency(False) and bool(
            np.all(bandwidths(p.intra_bandwidth, fitting) >= bandwidths(p.inter_bandwidth, fitting))
        )

    def best_placements(self, speed: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What :attr:`best_time` picks from: the intra- and inter-node matrices on the fastest GPU (or at
        ``speed``) and, per size, whether it fits a node (see :func:`optimizer.costs.time_kernels.best_placement`).
        When :attr:`intra_never_slower`, the intra-node matrix stands for both (the loops that pick then
        read one matrix instead of two)."""
        at = float(self.rank_speed.max()) if speed is None else speed
        intra = self.time_matrix(True, at)
        inter = intra if self.intra_never_slower else self.time_matrix(False, at)
        return intra, inter, self.degrees <= self.node_size

    @cached_property
    def best_time(self) -> np.ndarray:
        """[n, D] the cheapest placement of each size: intra-node where the size fits a node, on the fastest GPU."""
        intra, inter, fits = self.best_placements()
        out = np.empty_like(inter)
        fill_best_time(intra, inter, fits, out)
        return out

    def best_time_at(self, speed: float) -> np.ndarray:
        """[n, D] :attr:`best_time` for groups whose slowest rank runs at ``speed`` (the cheapest placement
        of each size at that speed)."""
        if speed == float(self.rank_speed.max()):
            return self.best_time
        intra, inter, fits = self.best_placements(speed)
        out = np.empty_like(inter)
        fill_best_time(intra, inter, fits, out)
        return out

    def best_time_columns(self, columns: Sequence[int]) -> np.ndarray:
        """[len(columns), n] the columns ``columns`` of :attr:`best_time`, without building the whole
        table when it is not built yet."""
        if "best_time" in self.__dict__:
            return np.ascontiguousarray(self.best_time[:, list(columns)].T)
        out = np.empty((len(columns), self.n_samples))
        fill_best_columns(*self.best_placements(), np.asarray(columns, dtype=np.int64), out)
        return out

    def best_time_rows(self, rows: np.ndarray) -> np.ndarray:
        """[len(rows), D] the rows ``rows`` of :attr:`best_time`, without building the whole table when it
        is not built yet."""
        if "best_time" in self.__dict__:
            return self.best_time[rows]
        intra, inter, fits = self.best_placements()
        out = np.empty((len(rows), len(self.degrees)))
        fill_best_time(intra[rows], inter[rows], fits, out)
        return out

    @cached_property
    def min_degree_index(self) -> np.ndarray:
        """[n] index into ``degrees`` of the smallest size on which each sample fits in memory (alone, at
        the roomiest rank's capacity: no plan puts it on a smaller group under either memory rule)."""
        cap = float(self.sample_capacity.max())
        # The first size with lengths <= cap * size; 0 where none fits (build refuses such batches).
        first = np.searchsorted(cap * self.degrees, self.lengths, side="left")
        return np.where(first < len(self.degrees), first, 0)

    @cached_property
    def _rank_lists(self) -> tuple[list[int], list[float], list[float]]:
        return self.rank_node.tolist(), self.rank_speed.tolist(), self.rank_capacity.tolist()

    @cached_property
    def _span_cache(self) -> dict[tuple[int, ...], tuple[bool, float, float]]:
        return {}

    def group_span(self, ranks: tuple[int, ...]) -> tuple[bool, float, float]:
        """(intra-node?, slowest speed, smallest capacity) of a rank group."""
        cache = self._span_cache
        hit = cache.get(ranks)
        if hit is None:
            nodes, speeds, caps = self._rank_lists
            first = nodes[ranks[0]]
            intra = all(nodes[r] == first for r in ranks)
            if self.homogeneous:
                hit = (intra, speeds[0], caps[0])
            else:
                hit = (intra, min(speeds[r] for r in ranks), min(caps[r] for r in ranks))
            cache[ranks] = hit
        return hit

    def group_time(self, samples: list[int] | np.ndarray | tuple[int, ...], ranks: tuple[int, ...]) -> float:
        """Predicted seconds of a group holding ``samples`` on ``ranks`` in one micro-batch."""
        if len(samples) == 0:
            return 0.0
        intra, speed, _ = self.group_span(ranks)
        j = self.degree_index[len(ranks)]
        return float(self.group_constants(intra)[j]) + float(
            self.time_matrix(intra, speed)[np.asarray(samples), j].sum()
        )
