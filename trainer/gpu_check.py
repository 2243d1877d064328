r"""Device check on one accelerator: attention exactness and cost-model predictions, without a second device.

    python -m trainer.gpu_check                              # CUDA when there is one: bf16, 1k-32k tokens, groups 1-8
    python -m trainer.gpu_check --device cpu --lengths 64,128,256 --hidden 64 --heads 4 --ffn-hidden 128 \
        --exact-tokens 256

1. Exactness: ring attention of one rank (d = 1, no peers) against torch SDPA, both at ``--dtype``
   with grouped-query heads, each against float64 attention of the same inputs (largest absolute
   error of output, dq, dk, dv) at up to ``--exact-tokens`` tokens.
2. Cost model: one rank's share of a micro-batch of a group of size d (its zig-zag tokens, padding
   included, every one of the ring's d blocks computed, the exchange looped back: what a rank of a
   real group computes) is timed for the given lengths, group sizes and sample counts, the profile's
   compute terms are fitted (:func:`trainer.profiler.fit`), and held-out micro-batches (seeded
   random lengths and sample counts, sizes 1 to the largest degree) are predicted and measured.
   Prints the fit's R^2, each held-out batch's error, their mean and worst.

Transfers are not part of this check (one device); ``dhp profile --procs N`` measures them.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from typing import Any


def exactness(device: Any, dtype: Any, tokens: int, heads: int, kv_heads: int, dim: int) -> dict[str, list[float]]:
    """Largest errors (out, dq, dk, dv) of ring attention at d = 1 and of SDPA, both against float64."""
    import torch

    from trainer._testing import sdpa_errors
    from trainer.ring_attention import RingSpec, full_attention, ring_attention, shard_layout

    lengths = [tokens // 2, tokens // 4, tokens // 8, tokens - tokens // 2 - tokens // 4 - tokens // 8]
    layout = [(p.to(device), s.to(device)) for p, s in shard_layout(lengths, 1)]
    g = torch.Generator().manual_seed(0)
    shapes = [(tokens, heads, dim), (tokens, kv_heads, dim), (tokens, kv_heads, dim), (tokens, heads, dim)]
    q, k, v, go = (
        torch.randn(s, generator=g, dtype=torch.float64).to(dtype).to(device=device, dtype=torch.float64)
        for s in shapes
    )
    ql, kl, vl = (x.to(dtype).requires_grad_(True) for x in (q, k, v))
    out = ring_attention(ql, kl, vl, RingSpec(None, (0,), 0, tuple(layout)))
    out.backward(go.to(dtype))
    qf, kf, vf = (x.clone().requires_grad_(True) for x in (q, k, v))
    pos, seg = layout[0]
    ref = full_attention(qf, kf, vf, pos, seg)
    ref.backward(go)
    ref_grads = [t.grad for t in (qf, kf, vf)]
    ours = [float((out.detach().double() - ref.detach()).abs().max())] + [
        float((t.grad.double() - r).abs().max())
        for t, r in zip((ql, kl, vl), ref_grads, strict=True)
        if t.grad is not None and r is not None
    ]
    theirs = sdpa_errors(q, k, v, go, pos, seg, dtype, ref.detach(), [r for r in ref_grads if r is not None])
    return {"ring_d1": ours, "sdpa": theirs}


def held_out(
    lengths: list[int], degrees: list[int], capacity: int, count: int, seed: int
) -> list[tuple[tuple[int, ...], int]]:
    """Seeded micro-batches (sample lengths, group size) unlike the fitted grid, within ``capacity`` tokens per rank."""
    rng = random.Random(seed)
    lo, hi = min(lengths), max(lengths)
    out: list[tuple[tuple[int, ...], int]] = []
    while len(out) < count:
        d = rng.choice(degrees)
        n = rng.choice([1, 2, 3, 5, 8, 13])
        sample = tuple(int(round(lo * (hi / lo) ** rng.random())) for _ in range(n))
        if sum(sample) / d <= capacity:
            out.append((sample, d))
    return out


def cost_model(
    device: Any,
    dtype_name: str,
    lengths: list[int],
    degrees: list[int],
    mixes: list[int],
    cfg: Any,
    repeats: int,
    count: int,
    progress: Any,
) -> dict[str, Any]:
    import torch

    from trainer.profiler import Point, fit, time_group
    from trainer.tiny_model import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(cfg).to(device=device, dtype=getattr(torch, dtype_name))
    capacity = max(lengths) * max(mixes)
    combos = [((L,) * n, d) for d in degrees for L in lengths for n in mixes if L * n / d <= capacity]
    tests = held_out(lengths, degrees, capacity, count, seed=1)
    # Runs are taken in rounds over all points (the fastest kept), so a burst of other work spoils one run, not a point.
    best = [math.inf] * (len(combos) + len(tests))
    for rnd in range(repeats):
        for i, (sample, d) in enumerate(combos + tests):
            best[i] = min(best[i], time_group(model, sample, d, device, 1, 1 if rnd == 0 else 0))
    points = [Point(sample, d, best[i]) for i, (sample, d) in enumerate(combos)]
    for p in points:
        progress(f"d={p.degree} {len(p.lengths)}x{p.lengths[0]}: {p.seconds * 1000:.2f} ms")
    f = fit(points)
    plain = fit(points, sample_step=False)
    progress(
        f"fit: R^2 {f.r2:.4f}, worst point {f.max_rel_error * 100:.1f}%, "
        f"per-sample ring-step work {f.sample_step * 1e6:.1f} us (without that term: R^2 {plain.r2:.4f}, "
        f"worst point {plain.max_rel_error * 100:.1f}%)"
    )
    rows: list[dict[str, Any]] = []
    for k, (sample, d) in enumerate(tests):
        measured = best[len(combos) + k]
        predicted, before = f.predict(sample, d), plain.predict(sample, d)
        rows.append(
            {
                "lengths": list(sample),
                "degree": d,
                "measured_s": measured,
                "predicted_s": predicted,
                "error": (predicted - measured) / measured,
                "error_without_term": (before - measured) / measured,
            }
        )
        progress(
            f"held out d={d} lengths {list(sample)}: predicted {predicted * 1000:.2f} ms, "
            f"measured {measured * 1000:.2f} ms, error {rows[-1]['error'] * 100:+.1f}% (without the term "
            f"{rows[-1]['error_without_term'] * 100:+.1f}%)"
        )
    errors = [abs(r["error"]) for r in rows]
    before_errors = [abs(r["error_without_term"]) for r in rows]
    return {
        "r2": f.r2,
        "fit_worst": f.max_rel_error,
        "sample_step_s": f.sample_step,
        "held_out": rows,
        "mean_abs_error": statistics.mean(errors),
        "worst_abs_error": max(errors),
        "mean_abs_error_without_term": statistics.mean(before_errors),
        "worst_abs_error_without_term": max(before_errors),
    }


CUDA_KERNEL_SHAPES = "4x8192@1,1x32768@1,32x512@4"


def _shape(text: str) -> tuple[tuple[int, ...], int]:
    """``COUNTxLENGTH@DEGREE`` -> (lengths, degree)."""
    try:
        mix, degree = text.split("@")
        count, length = mix.split("x")
        return (int(length),) * int(count), int(degree)
    except ValueError:
        raise ValueError(f"--kernel-shapes takes COUNTxLENGTH@DEGREE items such as 4x8192@1, got {text!r}") from None


def kernel_times(
    device: Any, dtype_name: str, cfg: Any, shapes: list[tuple[tuple[int, ...], int]], repeats: int, progress: Any
) -> list[dict[str, Any]]:
    """One rank's share of each micro-batch timed with the plain-product tiles and with the fused kernel
    (where the device has one)."""
    import os

    import torch

    from trainer import attention_tiles
    from trainer.profiler import time_group
    from trainer.tiny_model import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(cfg).to(device=device, dtype=getattr(torch, dtype_name))
    choices = ["matmul"] + (["fused"] if attention_tiles.kernel_for(device, "auto") == "fused" else [])
    rows = []
    before = os.environ.get("DHP_ATTENTION_KERNEL")
    try:
        for lengths, d in shapes:
            row: dict[str, Any] = {"lengths": len(lengths), "length": lengths[0], "degree": d}
            for choice in choices:
                os.environ["DHP_ATTENTION_KERNEL"] = choice
                row[f"{choice}_s"] = time_group(model, lengths, d, device, repeats, 1)
            rows.append(row)
            progress(
                f"kernels, {len(lengths)} x {lengths[0]} tokens on d={d}: "
                + ", ".join(f"{c} {row[c + '_s'] * 1000:.2f} ms" for c in choices)
            )
    finally:
        if before is None:
            os.environ.pop("DHP_ATTENTION_KERNEL", None)
        else:
            os.environ["DHP_ATTENTION_KERNEL"] = before
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    ap.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    ap.add_argument("--degrees", default="1,2,4,8")
    ap.add_argument("--mixes", default="1,2,4")
    ap.add_argument("--held-out", type=int, default=12, help="held-out micro-batches to predict (default 12)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ffn-hidden", type=int, default=4096)
    ap.add_argument("--tile", type=int, help="query rows per attention tile (default 128 on CPU, 1024 on CUDA)")
    ap.add_argument("--exact-tokens", type=int, default=4096, help="tokens of the exactness check (default 4096)")
    ap.add_argument(
        "--exact-dtypes", default="float32,bfloat16,float16", help="dtypes of the exactness check (default all three)"
    )
    ap.add_argument(
        "--kernel-shapes",
        default=None,
        help="micro-batches timed with each tile kernel, as COUNTxLENGTH@DEGREE (default on CUDA "
        "4x8192@1,1x32768@1,32x512@4, elsewhere 2xLONGEST@1,8xSHORTEST@2 of --lengths; empty: none)",
    )
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)

    import torch

    from trainer import attention_tiles
    from trainer.profiler import resolve_device
    from trainer.tiny_model import TinyConfig

    try:
        device = resolve_device(args.device)
        lengths = [int(x) for x in args.lengths.split(",")]
        degrees = [int(x) for x in args.degrees.split(",")]
        mixes = [int(x) for x in args.mixes.split(",")]
        exact_dtypes = [x for x in args.exact_dtypes.split(",") if x]
        for name in exact_dtypes:
            if name not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"--exact-dtypes takes float32, bfloat16 and float16, got {name!r}")
        shapes_text = args.kernel_shapes
        if shapes_text is None:
            shapes_text = CUDA_KERNEL_SHAPES if device.type == "cuda" else f"2x{max(lengths)}@1,8x{min(lengths)}@2"
        kernel_shapes = [_shape(x) for x in shapes_text.split(",") if x]
        cfg = TinyConfig(
            vocab=96,
            hidden=args.hidden,
            heads=args.heads,
            layers=args.layers,
            ffn_hidden=args.ffn_hidden,
            max_positions=max(lengths) + 1,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    attention_tiles.TILE = args.tile or (1024 if device.type == "cuda" else 128)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    say(
        f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
        f"{args.dtype}, tile {attention_tiles.TILE}"
    )
    kernel = attention_tiles.kernel_for(device)
    why = attention_tiles.cuda_fused_problem(device) if device.type == "cuda" else None
    say(f"tile kernel: {kernel}" + (f" ({why})" if why else ""))
    kv = max(1, args.heads // 4)
    names = ("out", "dq", "dk", "dv")
    exact: dict[str, dict[str, list[float]]] = {}
    for name in exact_dtypes:
        exact[name] = exactness(
            device, getattr(torch, name), args.exact_tokens, args.heads, kv, args.hidden // args.heads
        )
        say(
            f"exactness at {args.exact_tokens} tokens, {args.heads} query / {kv} key-value heads, "
            f"{name} (largest absolute error against float64):"
        )
        for who in ("ring_d1", "sdpa"):
            say(f"  {who:8} " + "  ".join(f"{n} {e:.2e}" for n, e in zip(names, exact[name][who], strict=True)))
    kernels = kernel_times(device, args.dtype, cfg, kernel_shapes, args.repeats, say) if kernel_shapes else []
    costs = cost_model(device, args.dtype, lengths, degrees, mixes, cfg, args.repeats, args.held_out, say)
    say(
        f"held-out micro-batches: mean |error| {costs['mean_abs_error'] * 100:.1f}%, "
        f"worst {costs['worst_abs_error'] * 100:.1f}% (without the ring-step term: "
        f"mean {costs['mean_abs_error_without_term'] * 100:.1f}%, "
        f"worst {costs['worst_abs_error_without_term'] * 100:.1f}%)"
    )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "device": str(device),
                    "dtype": args.dtype,
                    "tile_kernel": kernel,
                    "fused_problem": why,
                    "exactness": exact,
                    "kernel_times": kernels,
                    "cost_model": costs,
                },
                fh,
                indent=1,
            )
    ok = all(math.isfinite(x) for e in exact.values() for x in e["ring_d1"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
