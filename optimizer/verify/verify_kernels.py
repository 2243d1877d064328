"""The verifier's recomputation of group times, compiled (see :mod:`optimizer.jit`).

These loops evaluate the scalar cost formula of :mod:`optimizer.costs.profile` (the same formula as
:func:`optimizer.costs.tables.sample_time` and :func:`optimizer.costs.tables.vision_work`, term for term and in
the same order, so the results agree to the last bit) straight from the profile's coefficients and
the batch, never from the planners' cost tables. A plan's groups arrive flattened: the ranks of all
groups concatenated, with offsets (``rank_start[g]:rank_start[g + 1]`` are group g's), likewise the
sample indices, and ``mb_start`` the first group of each micro-batch.

``coef`` holds the profile's numbers: quadratic, linear, sample_constant, group_constant,
bytes_per_token, messages_per_step, inter-node latency, intra-node latency, sample_step, the group
messages per ring step and fixed, and the fixed messages per sample, and the all-to-all bytes per
token of hybrid groups (indices below); ``pad_unit`` > 0 sends the bytes of each sample padded to a
multiple of ``pad_unit`` times the group size; ``per_sample`` makes a group's tokens per rank those
of its longest sample (memory per sample) instead of all its samples'. ``bandwidth[1, d]`` is the
intra-node bandwidth of a group of size d and ``bandwidth[0, d]`` the inter-node one, read from the
profile for the sizes in the plan.
"""

from __future__ import annotations

import numpy as np

from optimizer.jit import compiled

(
    QUADRATIC,
    LINEAR,
    SAMPLE_CONSTANT,
    GROUP_CONSTANT,
    BYTES_PER_TOKEN,
    MESSAGES_PER_STEP,
    INTER_LATENCY,
    INTRA_LATENCY,
    SAMPLE_STEP,
    GROUP_MESSAGES_PER_STEP,
    GROUP_MESSAGES_FIXED,
    MESSAGES_FIXED,
    ULYSSES_BYTES_PER_TOKEN,
) = range(13)
SHARE, A2A_SHARE, STEPS = range(3)
"""Rows of ``exchange``: per group size d, the share of a sample's volume each rank sends, the share of
its all-to-all volume (hybrid groups), and the message steps (:mod:`optimizer.costs.cp_schemes`)."""


@compiled
def vision_seconds(
    tokens: np.ndarray, frames: np.ndarray, image_start: np.ndarray, linear: float, quadratic: float, out: np.ndarray
) -> None:
    """``out[i]``: vision-encoder seconds of sample i on one rank, over its images
    ``image_start[i]:image_start[i + 1]``."""
    for i in range(out.shape[0]):
        total = 0.0
        for j in range(image_start[i], image_start[i + 1]):
            p = tokens[j]
            total += frames[j] * (linear * p + quadratic * p * p)
        out[i] = total


@compiled
def sample_seconds(
    length: int,
    vision: float,
    d: int,
    intra: bool,
    speed: float,
    coef: np.ndarray,
    exchange: np.ndarray,
    overlap: bool,
    bandwidth: np.ndarray,
    pad_unit: int,
) -> float:
    """Seconds one sample of ``length`` tokens adds to a group of size ``d`` whose slowest GPU has ``speed``."""
    q = coef[QUADRATIC]
    attention = q * length * length / d / speed
    compute = (q * length * length + coef[LINEAR] * length + vision) / d / speed + coef[SAMPLE_CONSTANT] / speed
    if d == 1:
        return compute
    compute += coef[SAMPLE_STEP] * (d - 1) / speed
    bw = bandwidth[1 if intra else 0, d]
    share = exchange[SHARE, d]
    latency = coef[INTRA_LATENCY] if intra else coef[INTER_LATENCY]
    sent = length
    if pad_unit > 0:
        unit = pad_unit * d
        sent = -(-length // unit) * unit
    comm = (
        coef[BYTES_PER_TOKEN] * sent * share / bw
        + (coef[MESSAGES_PER_STEP] * exchange[STEPS, d] + coef[MESSAGES_FIXED]) * latency
    )
    if overlap:
        comm = max(0.0, comm - attention)
    if coef[ULYSSES_BYTES_PER_TOKEN] > 0.0:
        comm += coef[ULYSSES_BYTES_PER_TOKEN] * sent * exchange[A2A_SHARE, d] / bw
    return compute + comm


@compiled
def recompute_groups(
    ranks: np.ndarray,
    rank_start: np.ndarray,
    samples: np.ndarray,
    sample_start: np.ndarray,
    mb_start: np.ndarray,
    rank_node: np.ndarray,
    rank_speed: np.ndarray,
    rank_capacity: np.ndarray,
    lengths: np.ndarray,
    vision: np.ndarray,
    coef: np.ndarray,
    exchange: np.ndarray,
    overlap: bool,
    bandwidth: np.ndarray,
    pad_unit: int,
    per_sample: bool,
    seconds: np.ndarray,
    per_rank: np.ndarray,
    capacity: np.ndarray,
    intra: np.ndarray,
) -> tuple[float, int]:
    """Every group's seconds, tokens per rank, smallest capacity and span, into the output arrays.

    A group without ranks or with a rank out of range gets NaN and is left out of the step; sample
    indices out of range are left out of its sums (their group still counts the others). The step
    is the sum over micro-batches of the slowest group. Returns (step seconds, the number of times
    a rank appears again within a micro-batch, in the same group or another).
    """
    n_ranks = rank_node.shape[0]
    n_samples = lengths.shape[0]
    stamp = np.full(n_ranks, -1, dtype=np.int64)
    repeats = 0
    step = 0.0
    for m in range(mb_start.shape[0] - 1):
        slowest = 0.0
        for g in range(mb_start[m], mb_start[m + 1]):
            a = rank_start[g]
            b = rank_start[g + 1]
            d = b - a
            valid = d > 0
            for j in range(a, b):
                if ranks[j] < 0 or ranks[j] >= n_ranks:
                    valid = False
            if not valid:
                seconds[g] = np.nan
                per_rank[g] = np.nan
                capacity[g] = np.nan
                intra[g] = False
                continue
            first = ranks[a]
            same_node = True
            speed = rank_speed[first]
            cap = rank_capacity[first]
            for j in range(a, b):
                r = ranks[j]
                if rank_node[r] != rank_node[first]:
                    same_node = False
                speed = min(speed, rank_speed[r])
                cap = min(cap, rank_capacity[r])
                if stamp[r] == m:
                    repeats += 1
                stamp[r] = m
            total = coef[GROUP_CONSTANT]
            if d > 1:
                total += (coef[GROUP_MESSAGES_PER_STEP] * (d - 1) + coef[GROUP_MESSAGES_FIXED]) * (
                    coef[INTRA_LATENCY] if same_node else coef[INTER_LATENCY]
                )
            tokens = 0
            counted = 0
            for j in range(sample_start[g], sample_start[g + 1]):
                i = samples[j]
                if 0 <= i < n_samples:
                    total += sample_seconds(
                        lengths[i], vision[i], d, same_node, speed, coef, exchange, overlap, bandwidth, pad_unit
                    )
                    tokens = max(tokens, lengths[i]) if per_sample else tokens + lengths[i]
                    counted += 1
            if counted == 0:
                total = 0.0
            seconds[g] = total
            per_rank[g] = tokens / d
            capacity[g] = cap
            intra[g] = same_node
            slowest = max(slowest, total)
        step += slowest
    return step, repeats
