"""Measuring a job's cost profile on the local device (CPU here, CUDA where there is one).

What is timed. For each group size d and a few sample mixes, one rank's part of a micro-batch run by
the trainer's own code (:func:`trainer.step.run_micro_batch`: its zig-zag share of the tokens,
padding included, forward, loss, backward), with the ring's key/value exchange looped back
(:data:`trainer.ring_attention.LOOPBACK`): the rank's compute, dense layers and attention together.
Runs are taken in rounds over all points and the fastest run of each point is kept. With
``procs`` > 1 that many processes time together (sharing the machine as the job's ranks will), and
then run real rings over the job's backend (gloo on CPU, NCCL on GPUs) for the group sizes up to
``procs``; their excess over the compute gives the transfer terms. With one process a ping-pong
between two processes, fitted to ``latency + bytes / bandwidth``, gives them instead. The model
timed is the tiny model or the Hugging Face Llama that ``trainer.train_hf`` trains, with the same
dimensions (:attr:`ProfileSettings.architecture`, ``dhp profile --arch``).

What is fitted. The profile's formula (:mod:`optimizer.costs.profile`) for one group of size d holding
samples of lengths L_i is ``b + sum_i ((a2 L_i^2 + a1 L_i) / d + a0 + c (d-1))`` plus the ring
transfer; the coefficients (a2, a1, a0, b, c) >= 0 come from non-negative least squares over the
measurements (weighted for relative error). ``c`` is the work each sample adds per extra ring step
(its chunks are separate tiles in every one of the d blocks a rank computes): many short samples on
a wide group cost more than on one rank, which the other terms cannot say. The profile carries it
as ``time.sample_step``. Besides the usual lengths and mixes, each group size is measured with many
short samples (:attr:`ProfileSettings.short_mix`), the shape that exposes c.

The transfers follow what the trainer does (:mod:`trainer.ring_attention`): per layer and micro-batch
a group's ring makes d-1 exchanges forward and 2d-1 backward, each carrying all its samples' keys
and values (or their gradients) at once: ``comm.group_messages`` ``{"per_step": 3 x layers, "fixed":
layers}`` messages per group and micro-batch, whatever its sample count, each costing the fitted
latency. The bytes are those of the samples padded to a multiple of 2d (``comm.padded_bytes``):
keys and values forward once and again backward with their gradients,
``bytes_per_token = layers x kv width x (4 x element size + 2 x accumulator size)``, the kv width
being ``hidden x kv_heads / heads``. Every step ends with the gradient all-reduce over the job:
with several processes the time a real step spends beyond its micro-batches (the all-reduces and
the step's own work) is timed and becomes ``time.step_constant``.

The fit's quality is reported as R^2 and the largest relative error of predicted against measured
time; :func:`check_fit` refuses a fit below the stated thresholds, one whose times do not grow with
the lengths, or one with a transfer rate no machine has (``dhp profile`` exits 2 naming the flag).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from optimizer.costs.nnls import nnls
from optimizer.plan.sharding import padded_length
from trainer.ring_attention import LOOPBACK
from trainer.tiny_model import TinyConfig, TinyTransformer

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ProfileSettings:
    """What to measure."""

    lengths: tuple[int, ...] = (128, 256, 512, 1024, 1536)
    """Sample lengths in tokens."""
    degrees: tuple[int, ...] = (1, 2, 3, 4)
    """Group sizes."""
    mixes: tuple[int, ...] = (1, 2, 3)
    """Samples per group (equal lengths), to separate per-sample from per-group constants."""
    repeats: int = 3
    """Timed runs per point, taken in rounds over all points (the fastest is kept: other work on the
    machine only ever adds time)."""
    warmup: int = 1
    """Untimed runs per point."""
    device: str = "auto"
    """``cpu``, ``cuda`` or ``auto`` (CUDA when there is one)."""
    dtype: str = "float32"
    """Element type of the model."""
    comm: bool = True
    """Measure transfers between two processes (else the comm terms come from --bandwidth)."""
    message_bytes: tuple[int, ...] = (1 << 12, 1 << 15, 1 << 18, 1 << 20, 1 << 22)
    """Message sizes of the transfer probe."""
    capacity_tokens: int | None = None
    """Tokens per rank per micro-batch; None: from free GPU memory on CUDA, 65536 on CPU."""
    procs: int = 1
    """Processes timing the same points at once (as many as the job runs per machine, so that they
    share the machine's cores and memory bandwidth as the job's ranks will); each point keeps the
    slowest process, as a step waits for its slowest rank."""
    threads: int | None = None
    """CPU threads per process (None: torch's choice)."""
    short_mix: int = 16
    """Also time this many samples of the shortest length on every group size (0: not)."""
    architecture: str = "tiny"
    """The model timed: ``tiny`` (:class:`trainer.tiny_model.TinyTransformer`), ``llama`` (the Hugging
    Face Llama of :func:`trainer.hf_adapter.tiny_llama` that ``trainer.train_hf`` trains, with the
    config's dimensions, ``ffn_hidden`` as its MLP width and ``kv_heads`` key/value heads) or ``qwen2``
    (the Hugging Face Qwen2 of the same dimensions: biases on the query, key and value projections)."""
    kv_heads: int | None = None
    """Key/value heads of the ``llama`` architecture (None: as many as query heads)."""

    def __post_init__(self) -> None:
        for name in ("lengths", "degrees", "mixes", "message_bytes"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or v < 1 for v in values):
                raise ValueError(f"{name} must be positive integers, got {values!r}")
        if self.short_mix < 0:
            raise ValueError(f"short_mix must be >= 0, got {self.short_mix!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in ("float32", "float64", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, float64, bfloat16 or float16, got {self.dtype!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture must be one of {ARCHITECTURES}, got {self.architecture!r}")
        if self.kv_heads is not None and (self.architecture == "tiny" or self.kv_heads < 1):
            raise ValueError(f"kv_heads {self.kv_heads!r} needs the llama or qwen2 architecture and a positive count")


ARCHITECTURES = ("tiny", "llama", "qwen2")
"""The models :func:`build_model` builds."""


def build_model(cfg: TinyConfig, settings: ProfileSettings, device: torch.device) -> torch.nn.Module:
    """The model the profile is measured on (:attr:`ProfileSettings.architecture`), seeded, on ``device``."""
    dtype = getattr(torch, settings.dtype)
    torch.manual_seed(0)
    if settings.architecture == "tiny":
        return TinyTransformer(cfg).to(device=device, dtype=dtype)
    from trainer.hf_adapter import HFCausalLM, tiny_llama, tiny_qwen2

    kv = settings.kv_heads or cfg.heads
    if cfg.heads % kv:
        raise ValueError(f"heads {cfg.heads} must be a multiple of kv_heads {kv}")
    build = tiny_qwen2 if settings.architecture == "qwen2" else tiny_llama
    llm = build(
        0,
        dtype,
        vocab_size=cfg.vocab,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn_hidden,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=kv,
        max_position_embeddings=cfg.max_positions,
    )
    return HFCausalLM(llm.to(device))


def vocab_of(model: torch.nn.Module) -> int:
    """Vocabulary size of a profiled model (the tiny model's config, or the wrapped model's)."""
    vocab: Any = getattr(model, "vocab", None)
    cfg: Any = getattr(model, "cfg", None)
    return int(vocab) if vocab is not None else int(cfg.vocab)


@dataclass(frozen=True)
class Point:
    """One measurement: a group of size ``degree`` holding samples of these lengths."""

    lengths: tuple[int, ...]
    degree: int
    seconds: float


@dataclass
class Fit:
    quadratic: float
    linear: float
    sample_constant: float
    group_constant: float
    r2: float
    max_rel_error: float
    points: list[dict[str, Any]] = field(default_factory=list)
    sample_step: float = 0.0
    """c: seconds each sample adds per extra ring step (times d - 1)."""

    def predict(self, lengths: Sequence[int], d: int) -> float:
        return self.group_constant + sum(
            (self.quadratic * L * L + self.linear * L) / d + self.sample_constant + self.sample_step * (d - 1)
            for L in lengths
        )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but torch sees no CUDA device")
    return torch.device(name)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_group(
    model: torch.nn.Module,
    lengths: Sequence[int],
    d: int,
    device: torch.device,
    repeats: int = 3,
    warmup: int = 1,
    group: Any = LOOPBACK,
    position: int = 0,
) -> float:
    """Fastest seconds of one rank's part of a micro-batch: a group of size d holding these samples.

    It runs the trainer's own micro-batch code (:func:`trainer.step.run_micro_batch`: token
    gathering, layout, forward, loss and backward). With the default ``group`` the ring's exchange
    is looped back (compute only); with a real process group of ranks 0..d-1 every member must call
    it together and the time includes the ring's transfers.
    """
    from trainer.apply import apply_plan
    from trainer.step import label_count, run_micro_batch

    ids = [f"p{i}" for i in range(len(lengths))]
    doc = {
        "scheme": "ring",
        "micro_batches": [
            {"groups": [{"ranks": list(range(d)), "samples": ids, "lengths": [int(x) for x in lengths]}]}
        ],
    }
    mb = apply_plan(doc, position).micro_batches[0]
    gen = torch.Generator().manual_seed(0)
    samples = {k: torch.randint(vocab_of(model), (int(n),), generator=gen) for k, n in zip(ids, lengths, strict=True)}
    total = label_count(samples)
    times = []
    for i in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        _sync(device)
        t0 = time.perf_counter()
        run_micro_batch(model, mb, group, "ring", samples, total)
        _sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return min(times)


def measure_all(
    model: torch.nn.Module,
    cfg: TinyConfig,
    settings: ProfileSettings,
    device: torch.device,
    progress: Progress | None = None,
    tick: Callable[[], None] | None = None,
) -> tuple[list[Point], list[Point], float]:
    """(compute points, real ring points, seconds of the step's gradient all-reduce): the last two only
    with several processes (rings for sizes up to their number; 0 s with one process). ``tick`` is called
    after each timed run of one process."""
    points = []
    combos = _combos(settings)
    together = None
    rings: list[Point] = []
    reduction = 0.0
    if settings.procs > 1:
        from trainer.launch import spawn

        if progress:
            progress(
                f"timing {len(combos)} points on {settings.procs} processes at once, "
                f"then real rings of up to {settings.procs} ranks ..."
            )
        runs = spawn(_measure_worker, settings.procs, cfg, settings, str(device), threads=settings.threads or 1)
        together = [max(r[0][k] for r in runs) for k in range(len(combos))]
        ring_combos = [c for c in combos if 2 <= c[1] <= settings.procs]
        rings = [
            Point((L,) * n, d, max(r[1][k] for r in runs if k < len(r[1]))) for k, (L, d, n) in enumerate(ring_combos)
        ]
        # Each run ends when the slowest rank has its sums; the fastest run is the step's own cost.
        reduction = min(max(r[2][k] for r in runs) for k in range(len(runs[0][2])))
    alone = (
        together
        if together is not None
        else _sweep(combos, settings, lambda c, w: time_group(model, (c[0],) * c[2], c[1], device, 1, w), tick)
    )
    for k, (L, d, n) in enumerate(combos):
        points.append(Point((L,) * n, d, alone[k]))
        if progress and tick is None:
            progress(f"[{k + 1}/{len(combos)}] d={d} samples={n}x{L}: {alone[k] * 1000:.2f} ms")
    for p in rings:
        if progress:
            progress(
                f"ring d={p.degree} samples={len(p.lengths)}x{p.lengths[0]}: {p.seconds * 1000:.2f} ms with transfers"
            )
    if progress and settings.procs > 1:
        progress(
            f"step beyond its micro-batches (gradient all-reduce) over {settings.procs} processes: "
            f"{reduction * 1000:.2f} ms"
        )
    return points, rings, reduction


def _combos(settings: ProfileSettings) -> list[tuple[int, int, int]]:
    out = [(L, d, n) for d in settings.degrees for L in settings.lengths for n in settings.mixes]
    if settings.short_mix:
        out += [
            (min(settings.lengths), d, settings.short_mix)
            for d in settings.degrees
            if (min(settings.lengths), d, settings.short_mix) not in out
        ]
    return out


def _sweep(
    combos: list[tuple[int, int, int]],
    settings: ProfileSettings,
    run: Callable[[tuple[int, int, int], int], float],
    tick: Callable[[], None] | None = None,
) -> list[float]:
    """Fastest of ``settings.repeats`` runs of every point, the runs taken in rounds over all points
    (``tick`` called after each).

    A burst of other work on the machine then spoils one run of a few points, not every run of one.
    """
    best = [math.inf] * len(combos)
    for rnd in range(settings.repeats):
        for k, c in enumerate(combos):
            best[k] = min(best[k], run(c, settings.warmup if rnd == 0 else 0))
            if tick is not None:
                tick()
    return best


def _measure_worker(
    rank: int, world_size: int, cfg: TinyConfig, settings: ProfileSettings, device_name: str
) -> tuple[list[float], list[float], list[float]]:
    import torch.distributed as dist

    device = torch.device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
    model = build_model(cfg, settings, device)
    combos = _combos(settings)

    def alone(c: tuple[int, int, int], warmup: int) -> float:
        dist.barrier()
        return time_group(model, (c[0],) * c[2], c[1], device, 1, warmup)

    out = _sweep(combos, settings, alone)
    groups = {d: dist.new_group(list(range(d))) for d in sorted(set(settings.degrees)) if 2 <= d <= world_size}

    def ring(c: tuple[int, int, int], warmup: int) -> float:
        dist.barrier()
        if rank >= c[1]:
            return 0.0
        return time_group(model, (c[0],) * c[2], c[1], device, 1, warmup, group=groups[c[1]], position=rank)

    rings = _sweep([c for c in combos if c[1] in groups], settings, ring)
    return out, rings, time_step_overhead(model, device, settings.repeats + settings.warmup + 2)


def time_step_overhead(model: torch.nn.Module, device: torch.device, runs: int) -> list[float]:
    """Seconds each run of a step spends on this rank beyond its micro-batches: the gradient
    all-reduce, the loss's, and the step's own work (:func:`trainer.step.train_step` on a plan giving
    every rank one short sample alone; every rank calls it together)."""
    import torch.distributed as dist

    from trainer.apply import apply_plan
    from trainer.group_pool import GroupPool
    from trainer.step import train_step

    world = dist.get_world_size()
    doc = {
        "scheme": "ring",
        "micro_batches": [{"groups": [{"ranks": [r], "samples": [f"o{r}"], "lengths": [16]} for r in range(world)]}],
    }
    work = apply_plan(doc, dist.get_rank())
    pool = GroupPool()
    gen = torch.Generator().manual_seed(0)
    samples = {f"o{r}": torch.randint(vocab_of(model), (16,), generator=gen).to(device) for r in range(world)}
    out = []
    for _ in range(runs):
        model.zero_grad(set_to_none=True)
        dist.barrier()
        _sync(device)
        result = train_step(model, work, pool, samples)
        out.append(result.seconds - sum(result.micro_batch_seconds))
    return out


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with non-negative coefficients (:func:`optimizer.costs.nnls.nnls`, the refit's solver), its
    columns scaled to unit norm first as that solver asks (the terms here span ten orders of magnitude)."""
    norms = np.linalg.norm(x, axis=0)
    norms[norms == 0.0] = 1.0
    return nnls(x / norms, y) / norms


HOLD_OUT_EVERY = 4
"""Every fourth measured point is held out of a second fit, which predicts it (the report's held-out errors)."""


def held_out_errors(points: Sequence[Point]) -> tuple[float, float] | None:
    """(mean, worst) relative error on every :data:`HOLD_OUT_EVERY`-th point of a fit over the others."""
    test = [p for k, p in enumerate(points) if k % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1]
    train = [p for k, p in enumerate(points) if k % HOLD_OUT_EVERY != HOLD_OUT_EVERY - 1]
    if not test or len(train) < 6:
        return None
    f = fit(train)
    errors = [abs(f.predict(p.lengths, p.degree) / p.seconds - 1) for p in test]
    return sum(errors) / len(errors), max(errors)


def fit(points: Sequence[Point], sample_step: bool = True) -> Fit:
    """Fit (a2, a1, a0, b, c) to the measurements, weighting each point by 1/time (relative errors).

    With ``sample_step=False`` c stays 0 (the profile form without the per-sample ring-step term).
    """
    x = np.array(
        [
            [
                sum(L * L for L in p.lengths) / p.degree,
                sum(p.lengths) / p.degree,
                len(p.lengths),
                1.0,
                len(p.lengths) * (p.degree - 1),
            ]
            for p in points
        ]
    )
    if not sample_step:
        x = x[:, :4]
    y = np.array([p.seconds for p in points])
    w = 1.0 / y
    coef = _nnls(x * w[:, None], y * w)
    pred = x @ coef
    ss_res = float(((y - pred) ** 2).sum())
    ss_tot = float(((y - y.mean()) ** 2).sum())
    rel = np.abs(pred - y) / y
    rows = [
        {"lengths": list(p.lengths), "degree": p.degree, "measured_s": p.seconds, "predicted_s": float(q)}
        for p, q in zip(points, pred, strict=True)
    ]
    return Fit(
        float(coef[0]),
        float(coef[1]),
        float(coef[2]),
        float(coef[3]),
        1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        float(rel.max()),
        rows,
        float(coef[4]) if len(coef) > 4 else 0.0,
    )


# -- transfers --------------------------------------------------------------------------------


def _pingpong(rank: int, world_size: int, sizes: list[int], repeats: int, use_cuda: bool) -> list[float]:
    import torch.distributed as dist

    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    out = []
    peer = 1 - rank
    for n in sizes:
        buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=device)
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
            if use_cuda:
                torch.cuda.synchronize(device)
            if i:
                times.append((time.perf_counter() - t0) / 2)
        out.append(statistics.median(times))
    return out


def probe_transfers(
    sizes: Sequence[int], repeats: int = 5, use_cuda: bool = False
) -> tuple[float, float, list[tuple[int, float]]]:
    """(bandwidth bytes/s, latency s, [(bytes, one-way seconds)]) between two processes on this machine."""
    from trainer.launch import spawn

    backend = "nccl" if use_cuda else "gloo"
    res = spawn(_pingpong, 2, list(sizes), repeats, use_cuda, backend=backend)
    secs = res[0]
    x = np.array([[1.0, float(n)] for n in sizes])
    coef = _nnls(x, np.array(secs))
    latency, per_byte = float(coef[0]), float(coef[1])
    bandwidth = 1.0 / per_byte if per_byte > 0 else math.inf
    return bandwidth, latency, list(zip(sizes, secs, strict=True))


def fit_ring_transfers(
    compute: Fit,
    rings: Sequence[Point],
    bytes_per_token: float,
    messages: float,
    group: tuple[float, float] | None = None,
) -> tuple[float, float, dict[str, Any]]:
    """Bandwidth and per-exchange latency from real rings: what they took beyond the compute fit.

    Each ring point's excess over the fitted compute time is matched to the profile's transfer
    term by non-negative least squares: with ``group`` (g1, g0), the trainer's form
    ``sum_i k P(L_i, d) (d-1)/d / bw + (g1 (d-1) + g0) latency`` (padded bytes, the group's messages
    once per micro-batch); without, the per-sample form ``sum_i (k L_i (d-1)/d / bw + m (d-1) latency)``.
    The report gives the whole formula's R^2 and largest relative error on the ring points.
    """
    if group is None:
        x = np.array(
            [
                [
                    sum(bytes_per_token * L * (p.degree - 1) / p.degree for L in p.lengths),
                    len(p.lengths) * messages * (p.degree - 1),
                ]
                for p in rings
            ]
        )
    else:
        x = np.array(
            [
                [
                    sum(bytes_per_token * padded_length(L, p.degree) * (p.degree - 1) / p.degree for L in p.lengths),
                    group[0] * (p.degree - 1) + group[1],
                ]
                for p in rings
            ]
        )
    y = np.array([p.seconds - compute.predict(p.lengths, p.degree) for p in rings])
    w = 1.0 / np.array([p.seconds for p in rings])
    per_byte, latency = (float(v) for v in _nnls(x * w[:, None], y * w))
    bandwidth = 1.0 / per_byte if per_byte > 0 else math.inf
    total = np.array([compute.predict(p.lengths, p.degree) for p in rings]) + x @ np.array([per_byte, latency])
    measured = np.array([p.seconds for p in rings])
    ss_tot = float(((measured - measured.mean()) ** 2).sum())
    r2 = 1.0 - float(((measured - total) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    rows = [
        {"lengths": list(p.lengths), "degree": p.degree, "measured_s": p.seconds, "predicted_s": float(t)}
        for p, t in zip(rings, total, strict=True)
    ]
    return (
        bandwidth,
        latency,
        {"ring_r2": r2, "ring_max_rel_error": float((np.abs(total - measured) / measured).max()), "ring_points": rows},
    )


def group_messages(cfg: TinyConfig) -> tuple[float, float]:
    """(per ring step, fixed) messages a group of this implementation's ring exchanges per micro-batch:
    per layer d-1 forward and 2d-1 backward (keys and values, then their gradients once more), 3 (d-1) + 1."""
    return 3.0 * cfg.layers, float(cfg.layers)


def profile_document(
    f: Fit,
    bytes_per_token: float,
    bandwidth: float,
    latency: float,
    capacity: float,
    *,
    messages: float = 0.0,
    group: tuple[float, float] | None = None,
    step_constant: float = 0.0,
    source: str = "",
) -> dict[str, Any]:
    """The profile of a fit. With ``group`` the trainer's form (per-sample ring-step work in
    ``time.sample_step``, the group's messages per micro-batch, padded bytes, the step's all-reduce);
    without, the per-sample form (the ring-step work folded into the per-sample latency of
    ``messages`` exchanges per ring step), which is what this profiler wrote before."""
    time_doc: dict[str, Any] = {
        "quadratic": f.quadratic,
        "linear": f.linear,
        "sample_constant": f.sample_constant,
        "group_constant": f.group_constant,
    }
    comm: dict[str, Any] = {
        "scheme": "ring",
        "bytes_per_token": bytes_per_token,
        "bandwidth_bytes_per_s": {"intra": bandwidth, "inter": bandwidth},
    }
    if group is None:
        per_sample = latency + f.sample_step / messages
        comm.update(latency_s={"intra": per_sample, "inter": per_sample}, messages_per_step=messages)
    else:
        time_doc.update(sample_step=f.sample_step, step_constant=step_constant)
        comm.update(
            latency_s={"intra": latency, "inter": latency},
            group_messages={"per_step": group[0], "fixed": group[1]},
            padded_bytes=True,
        )
    out: dict[str, Any] = {"time": time_doc, "comm": comm, "capacity_tokens_per_rank": capacity}
    if source:
        out["source"] = source
    return out


def comm_terms(cfg: TinyConfig, dtype: torch.dtype, kv_heads: int | None = None) -> tuple[float, float]:
    """(bytes_per_token, messages_per_step) of this implementation's ring.

    Per layer, keys and values travel forward once and again in the backward pass in the model's
    dtype; their gradients travel in the accumulator dtype (float32, float64 for float64 models).
    With ``kv_heads`` key/value heads (grouped-query attention) keys and values are
    ``hidden x kv_heads / heads`` wide, and that is what the ring sends.
    """
    from trainer.attention_tiles import accumulator_dtype

    elem = torch.tensor([], dtype=dtype).element_size()
    acc = torch.tensor([], dtype=accumulator_dtype(dtype)).element_size()
    width = cfg.hidden * (kv_heads or cfg.heads) / cfg.heads
    return cfg.layers * width * (4.0 * elem + 2.0 * acc), 3.0 * cfg.layers


class FitRefused(ValueError):
    """The measured profile is not good enough to plan with; ``field`` names the threshold or measurement at fault."""

    def __init__(self, message: str, field: str, hint: str) -> None:
        super().__init__(message)
        self.field = field
        self.hint = hint


BANDWIDTH_RANGE = (1e6, 1e13)
"""Transfer rates (bytes/s) a fit may give: outside them the measured times did not grow with the bytes sent."""


def check_fit(report: dict[str, Any], min_r2: float, max_error: float) -> None:
    """Raise :class:`FitRefused` when the fit is degenerate or below the thresholds (see ``dhp profile --min-r2``)."""
    if report.get("per_token_s", 1.0) <= 0:
        raise FitRefused(
            "the compute fit has no term per token: the measured times did not grow with the sample lengths",
            "--lengths",
            "measure lengths far apart (e.g. 128 to 4096 tokens) so that the work per token shows.",
        )
    checks = [("r2", "max_rel_error", "compute")]
    if "ring_r2" in report:
        checks.append(("ring_r2", "ring_max_rel_error", "ring"))
    for r2_key, err_key, what in checks:
        r2, err = report[r2_key], report[err_key]
        if not math.isfinite(r2) or r2 < min_r2:
            raise FitRefused(
                f"the {what} fit explains too little of the measured times: R^2 {r2:.3f} < {min_r2:g}",
                "--min-r2",
                (
                    "the timings are noisy (other work on the machine?): rerun with more --repeats and fewer --procs, "
                    "or lower --min-r2 knowingly."
                ),
            )
        if not math.isfinite(err) or err > max_error:
            raise FitRefused(
                f"the {what} fit misses a measured point by {err * 100:.0f}% > {max_error * 100:g}%",
                "--max-error",
                "measure lengths and group sizes like the job's, add --repeats, or raise --max-error knowingly.",
            )
    bw = report.get("bandwidth_bytes_per_s")
    if report.get("comm_measured") and (bw is None or not BANDWIDTH_RANGE[0] <= bw <= BANDWIDTH_RANGE[1]):
        raise FitRefused(
            f"the transfer fit gives {bw:.3g} bytes/s, outside {BANDWIDTH_RANGE[0]:.0e}..{BANDWIDTH_RANGE[1]:.0e}: "
            "the measured times did not grow with the bytes sent",
            "--bandwidth",
            "measure longer samples or larger messages, or pass --no-comm --bandwidth with a known rate.",
        )
    lat = report.get("latency_s", 0.0)
    if not math.isfinite(lat) or lat > 1.0:
        raise FitRefused(
            f"the fit gives a latency of {lat:.3g} s per exchange",
            "--bandwidth",
            "rerun; the ring timings are dominated by noise.",
        )


def default_capacity(model: torch.nn.Module, device: torch.device) -> int:
    """Tokens per rank: 65536 on CPU; on CUDA, 80% of free memory over the activation bytes per token
    measured at 512 tokens."""
    if device.type != "cuda":
        return 65536
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    time_group(model, (512,), 1, device, repeats=1, warmup=0)
    per_token = max(1.0, (torch.cuda.max_memory_allocated(device) - base) / 512)
    free, _ = torch.cuda.mem_get_info(device)
    return int(0.8 * free / per_token)


def measure_profile(
    cfg: TinyConfig,
    settings: ProfileSettings,
    progress: Progress | None = None,
    bandwidth: float | None = None,
    latency: float = 0.0,
    min_r2: float | None = None,
    max_error: float | None = None,
    bar: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure and fit; returns (profile document for ``dhp plan --profile``, report).

    With ``min_r2`` / ``max_error`` a fit below them raises :class:`FitRefused` (:func:`check_fit`). With
    ``bar`` a progress bar of that name counts the timed runs (one process).
    """
    device = resolve_device(settings.device)
    dtype = getattr(torch, settings.dtype)
    model = build_model(cfg, settings, device)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    if progress:
        progress(
            f"device {device}, {torch.get_num_threads()} threads x {settings.procs} processes, "
            f"{settings.architecture} model {cfg}"
            + (f", {settings.kv_heads} key/value heads" if settings.kv_heads else "")
        )
    if bar is not None and settings.procs == 1:
        from tqdm import tqdm

        with tqdm(total=len(_combos(settings)) * settings.repeats, desc=bar, unit="run", leave=True) as pbar:
            points, rings, reduction = measure_all(model, cfg, settings, device, progress, pbar.update)
    else:
        points, rings, reduction = measure_all(model, cfg, settings, device, progress)
    f = fit(points)
    held = held_out_errors(points)
    transfers: list[tuple[int, float]] = []
    bpt, msgs = comm_terms(cfg, dtype, settings.kv_heads)
    group = group_messages(cfg)
    ring_fit: dict[str, Any] = {}
    if settings.comm and rings:
        bandwidth, latency, ring_fit = fit_ring_transfers(f, rings, bpt, msgs, group)
        if progress:
            progress(f"transfers from real rings: {bandwidth / 1e9:.3f} GB/s, {latency * 1e6:.1f} us per exchange")
    elif settings.comm:
        if progress:
            progress("measuring transfers between two processes ...")
        use_cuda = device.type == "cuda" and torch.cuda.device_count() >= 2
        bandwidth, latency, transfers = probe_transfers(settings.message_bytes, use_cuda=use_cuda)
    if bandwidth is None:
        raise ValueError("give a bandwidth when transfers are not measured")
    capacity = settings.capacity_tokens or default_capacity(model, device)
    source = (
        f"dhp profile on {device} ({settings.procs} x {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}), "
        f"{settings.architecture} model "
        f"{cfg.layers}x{cfg.hidden} ({cfg.heads}/{settings.kv_heads or cfg.heads} heads, MLP {cfg.ffn_hidden}), "
        f"{len(points)} points, R^2 {f.r2:.4f}, largest relative error {f.max_rel_error:.3f}"
    )
    profile = profile_document(
        f, bpt, bandwidth, latency, capacity, group=group, step_constant=reduction, source=source
    )
    report = {
        "r2": f.r2,
        "max_rel_error": f.max_rel_error,
        "held_out_mean_error": held[0] if held else None,
        "held_out_worst_error": held[1] if held else None,
        "points": f.points,
        "device": str(device),
        "sample_step_s": f.sample_step,
        "per_token_s": f.quadratic + f.linear,
        "step_constant_s": reduction,
        "group_messages": list(group),
        "comm_measured": settings.comm,
        "transfers": [{"bytes": n, "seconds": s} for n, s in transfers],
        "bandwidth_bytes_per_s": bandwidth,
        "latency_s": latency,
        **ring_fit,
    }
    if not all(math.isfinite(v) for v in (f.quadratic, f.linear, f.sample_constant, f.group_constant, f.sample_step)):
        raise ValueError("the fit produced a non-finite coefficient; measure more points")
    if min_r2 is not None or max_error is not None:
        check_fit(report, -math.inf if min_r2 is None else min_r2, math.inf if max_error is None else max_error)
    return profile, report
