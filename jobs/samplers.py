"""Sample orders of an epoch: sequential, seeded shuffle, length-grouped.

Each sampler returns the dataset's row indices cut into steps of the global batch size (the last
step shorter unless ``drop_last``). Seeds mix the sampler's seed and the epoch number, so every
epoch of a run has its own order and the same (seed, epoch) gives the same order on every machine.
"""

from __future__ import annotations

import numpy as np

from jobs.spec import SamplerSpec


def cut(order: np.ndarray, size: int, drop_last: bool) -> list[np.ndarray]:
    """``order`` in consecutive steps of ``size`` rows."""
    n = len(order) - (len(order) % size if drop_last else 0)
    return [order[i : i + size] for i in range(0, n, size)]


def _rng(spec: SamplerSpec) -> np.random.Generator:
    return np.random.default_rng([spec.seed, spec.epoch])


def sequential(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


def shuffled(n: int, spec: SamplerSpec) -> np.ndarray:
    return _rng(spec).permutation(n).astype(np.int64)


def length_grouped(lengths: np.ndarray, size: int, spec: SamplerSpec, drop_last: bool) -> list[np.ndarray]:
    """Shuffle, sort each run of ``group_batches`` steps' samples by length (longest first), cut
    into steps, and shuffle the steps; the step holding the longest sample goes first, so that a
    sample too long for the cluster shows at once. Steps then hold samples of similar length."""
    rng = _rng(spec)
    order = rng.permutation(len(lengths)).astype(np.int64)
    mega = size * spec.group_batches
    runs = [order[i : i + mega] for i in range(0, len(order), mega)]
    sorted_order = np.concatenate([run[np.argsort(-lengths[run], kind="stable")] for run in runs])
    steps = cut(sorted_order, size, drop_last)
    if not steps:
        return steps
    perm = rng.permutation(len(steps))
    steps = [steps[i] for i in perm]
    first = max(range(len(steps)), key=lambda i: (int(lengths[steps[i]].max()), -i))
    steps.insert(0, steps.pop(first))
    return steps


def epoch_steps(lengths: np.ndarray, size: int, spec: SamplerSpec, drop_last: bool) -> list[np.ndarray]:
    """The rows of every step of the epoch, in step order."""
    n = len(lengths)
    if spec.kind == "length-grouped":
        return length_grouped(lengths, size, spec, drop_last)
    order = sequential(n) if spec.kind == "sequential" else shuffled(n, spec)
    return cut(order, size, drop_last)
