"""A pool of process groups, created collectively and reused across steps.

Creating a communicator is a collective call over the whole job: every rank must create the same
groups in the same order, members or not. The pool keeps that rule by always creating groups in a
canonical order (sorted rank tuples, or the order of the plan's communicator list, which is the
same on every rank), and caches each group under its sorted rank tuple so later steps only look it
up. Where the backend supports it (NCCL with an eagerly initialised default group),
``torch.distributed.split_group`` creates a whole partition of disjoint groups in one call;
otherwise ``new_group`` creates them one by one (gloo on CPU).

A group of one rank needs no communicator: :meth:`GroupPool.get` returns None for it.

A hybrid plan's ranks also talk inside sub-groups of their groups (each rank's Ulysses sub-group and
ring, ``RankWork.sub_groups`` of :func:`trainer.apply.apply_plan`, the same list on every rank); they
are groups like any other, ensured after the plan's communicators (:func:`trainer.step.train_step`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

Ranks = tuple[int, ...]


def aligned_blocks(world_size: int, sizes: Iterable[int]) -> list[Ranks]:
    """All aligned contiguous blocks ``[k d, (k+1) d)`` of each size d >= 2, smallest size first."""
    out: list[Ranks] = []
    for d in sorted(set(int(s) for s in sizes)):
        if d < 2 or d > world_size:
            continue
        out.extend(tuple(range(a, a + d)) for a in range(0, world_size - d + 1, d))
    return out


def aligned_pow2_blocks(world_size: int) -> list[Ranks]:
    """The aligned blocks of every power-of-two size from 2 to ``world_size`` (N - 1 groups when N is
    a power of two): a family from which a planner can take its groups so that a job's pool stops
    growing (see ``python -m trainer.group_churn``)."""
    return aligned_blocks(world_size, [1 << k for k in range(1, world_size.bit_length()) if 1 << k <= world_size])


def canonical(ranks: Sequence[int]) -> Ranks:
    """The key of a group: its ranks sorted, without repeats."""
    key = tuple(sorted(int(r) for r in ranks))
    if len(set(key)) != len(key):
        raise ValueError(f"group {list(ranks)} repeats a rank")
    return key


@dataclass
class PoolStats:
    """What the pool did: groups created, look-ups served from the cache, seconds spent creating."""

    created: int = 0
    hits: int = 0
    create_seconds: float = 0.0
    split_calls: int = 0
    creation_log: list[Ranks] = field(default_factory=list)


class GroupPool:
    """Process groups keyed by their sorted ranks; see the module docstring for the calling rule."""

    def __init__(self, backend: str | None = None, use_split: bool | None = None, timeout: Any = None) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "torch.distributed is not initialised; call init_process_group before building a GroupPool"
            )
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.backend = backend
        self.timeout = timeout
        if use_split is None:
            use_split = _split_supported()
        self.use_split = use_split
        self._groups: dict[Ranks, Any] = {}
        self.stats = PoolStats()

    # -- look-ups --------------------------------------------------------------------------
    def __contains__(self, ranks: Sequence[int]) -> bool:
        key = canonical(ranks)
        return len(key) < 2 or key in self._groups

    def known(self) -> list[Ranks]:
        """Groups created so far, in creation order (what a planner request's existing_groups takes)."""
        return list(self._groups)

    def lookup(self, ranks: Sequence[int]) -> Any:
        """The cached group (None for a single rank); KeyError if it was never created. Not collective."""
        key = canonical(ranks)
        if len(key) < 2:
            return None
        group = self._groups[key]
        self.stats.hits += 1
        return group

    def get(self, ranks: Sequence[int]) -> Any:
        """The group, created on demand. Collective when it is created: every rank must make the same call."""
        key = canonical(ranks)
        if len(key) < 2:
            return None
        if key in self._groups:
            self.stats.hits += 1
            return self._groups[key]
        self._create([key])
        return self._groups[key]

    # -- creation (collective) -------------------------------------------------------------
    def ensure(self, groups: Iterable[Sequence[int]]) -> int:
        """Create every listed group not yet in the pool, in the listed order; returns how many were created.

        Collective: every rank must pass the same list (a plan's ``communicators`` is).
        """
        missing: list[Ranks] = []
        seen: set[Ranks] = set()
        for g in groups:
            key = canonical(g)
            if len(key) >= 2 and key not in self._groups and key not in seen:
                for r in key:
                    if not 0 <= r < self.world_size:
                        raise ValueError(f"group {list(key)} names rank {r} outside 0..{self.world_size - 1}")
                missing.append(key)
                seen.add(key)
        if missing:
            self._create(missing)
        return len(missing)

    def mean_create_seconds(self) -> float | None:
        """Measured seconds per group created so far on this rank (None before the first)."""
        return self.stats.create_seconds / self.stats.created if self.stats.created else None

    def precreate_blocks(self, sizes: Iterable[int]) -> int:
        """Create all aligned contiguous blocks of the given sizes (the groups a plan most often uses)."""
        return self.ensure(aligned_blocks(self.world_size, sizes))

    def _create(self, keys: list[Ranks]) -> None:
        start = time.perf_counter()
        if self.use_split:
            for part in _partitions(keys):
                kwargs: dict[str, Any] = {"split_ranks": [list(k) for k in part]}
                if self.timeout is not None:
                    kwargs["timeout"] = self.timeout
                mine = dist.split_group(**kwargs)
                self.stats.split_calls += 1
                for k in part:
                    # Ranks outside a group get None from split_group; record a marker so look-ups agree.
                    self._groups[k] = mine if self.rank in k else _NotMember(k)
                    self.stats.creation_log.append(k)
        else:
            for k in keys:
                kwargs = {"ranks": list(k)}
                if self.backend is not None:
                    kwargs["backend"] = self.backend
                if self.timeout is not None:
                    kwargs["timeout"] = self.timeout
                self._groups[k] = dist.new_group(**kwargs)
                self.stats.creation_log.append(k)
        self.stats.created += len(keys)
        self.stats.create_seconds += time.perf_counter() - start


class _NotMember:
    """Placeholder for a group this rank is not in (split_group returns None there)."""

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks

    def __repr__(self) -> str:
        return f"<not a member of {list(self.ranks)}>"


def _partitions(keys: list[Ranks]) -> list[list[Ranks]]:
    """Greedy split of the groups into sets of pairwise-disjoint groups, keeping their order."""
    parts: list[tuple[set[int], list[Ranks]]] = []
    for k in keys:
        for used, part in parts:
            if used.isdisjoint(k):
                used.update(k)
                part.append(k)
                break
        else:
            parts.append((set(k), [k]))
    return [p for _, p in parts]


def _split_supported() -> bool:
    """split_group needs a backend that can split (NCCL) and the default group bound to a device."""
    if not hasattr(dist, "split_group"):
        return False
    try:
        backend = dist.get_backend()
    except Exception:
        return False
    if backend != "nccl":
        return False
    default = dist.distributed_c10d._get_default_group()
    return getattr(default, "bound_device_id", None) is not None
