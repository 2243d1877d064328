"""``dhp profile``: measure this job's cost profile with torch and write it for ``dhp plan --profile``.

Imports torch only when the command runs, so ``dhp`` works without the trainer extra.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from optimizer.errors import ProblemError


def _ints(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ProblemError(
            f"{text!r} is not a comma-separated list of integers", field=flag, hint="e.g. 128,256,512."
        ) from None
    if not values or any(v < 1 for v in values):
        raise ProblemError(f"{text!r} must list positive integers", field=flag, hint="e.g. 128,256,512.")
    return values


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure a cost profile on this machine with torch (CPU or CUDA) and write it as JSON",
        description="Times the model's attention and dense layers for a range of lengths and group sizes, "
        "measures transfers between two processes, fits the profile coefficients and reports the fit.",
    )
    src = p.add_argument_group("the model (default: a small built-in one, --hidden and the flags below)")
    src.add_argument("--model-preset", help="profile a model preset of the planner (dhp presets), e.g. qwen2-vl-7b")
    src.add_argument("--model", help="profile the model of a model document (as dhp plan --model reads)")
    src.add_argument(
        "--hf-config", help="profile the model of a Hugging Face config.json (or its directory): llama, mistral, qwen2"
    )
    src.add_argument(
        "--budget-s",
        type=float,
        default=600.0,
        help="with a model: time budget of the measurements; the grid is cut to fit its estimate (default 600)",
    )
    p.add_argument(
        "--lengths",
        help="sample lengths in tokens (default 128,256,512,1024,1536; with a model, 256 up to its positions)",
    )
    p.add_argument("--degrees", help="group sizes (default 1,2,3,4; with a model, 1,2,3,4,6,8)")
    where = p.add_argument_group("the cluster: its inter-node terms, which one machine cannot measure")
    where.add_argument("--cluster-preset", help="take the inter-node bandwidth and latency from this cluster preset")
    where.add_argument("--cluster", help="take them from this cluster document")
    p.add_argument(
        "--mixes",
        default="1,2,3",
        help="samples per group, to separate per-sample and per-group constants (default 1,2,3)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per point; the fastest is kept (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per point (default 1)")
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to run (default: CUDA if there is one)"
    )
    p.add_argument("--dtype", choices=["float32", "float64", "bfloat16", "float16"], default="float32")
    p.add_argument("--threads", type=int, help="torch CPU threads per process (default: torch's choice)")
    p.add_argument(
        "--procs",
        type=int,
        default=1,
        help="processes timing at once, as many as the job's ranks per machine (default 1)",
    )
    p.add_argument("--hidden", type=int, default=128, help="model width (default 128)")
    p.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--ffn-hidden", type=int, default=512, help="MLP width (default 512)")
    p.add_argument("--vocab", type=int, default=96, help="vocabulary size (default 96)")
    p.add_argument(
        "--arch",
        choices=["tiny", "llama"],
        default="tiny",
        help="model timed: the tiny transformer or train_hf's Hugging Face Llama (default tiny)",
    )
    p.add_argument("--kv-heads", type=int, help="key/value heads of --arch llama (default: --heads)")
    p.add_argument("--no-comm", action="store_true", help="do not measure transfers; take --bandwidth instead")
    p.add_argument("--bandwidth", type=float, help="bytes per second between ranks when --no-comm is given")
    p.add_argument(
        "--capacity-tokens",
        type=int,
        help="tokens per rank per micro-batch (default: from free GPU memory, 65536 on CPU)",
    )
    p.add_argument(
        "--short-mix",
        type=int,
        default=16,
        help="also time this many samples of the shortest length per group size (default 16; 0: not)",
    )
    p.add_argument(
        "--min-r2", type=float, default=0.9, help="refuse (exit 2) a fit whose R^2 is below this (default 0.9)"
    )
    p.add_argument(
        "--max-error",
        type=float,
        default=0.5,
        help="refuse (exit 2) a fit that misses a measured point by more than this fraction (default 0.5)",
    )
    p.add_argument("--out", help="write the profile here instead of stdout")
    p.add_argument("--report", help="also write the measurements and the fit as JSON here")
    p.set_defaults(func=cmd_profile)


def _cluster(args: argparse.Namespace) -> tuple[str, Any] | None:
    """(where from, the cluster) of ``--cluster-preset`` / ``--cluster``, or None."""
    if args.cluster and args.cluster_preset:
        raise ProblemError("give --cluster or --cluster-preset, not both", field="--cluster", hint="drop one.")
    from optimizer.problem.documents import cluster_from_json, read_json_file

    if args.cluster_preset:
        from optimizer.presets import load_preset

        return f"cluster preset {args.cluster_preset}", cluster_from_json(
            load_preset("clusters", args.cluster_preset, "--cluster-preset"), "--cluster-preset"
        )
    if args.cluster:
        return f"cluster document {args.cluster}", cluster_from_json(
            read_json_file(args.cluster, "--cluster"), "--cluster"
        )
    return None


def cmd_profile(args: argparse.Namespace) -> int:
    try:
        import torch
    except ModuleNotFoundError:
        raise ProblemError(
            "torch is not installed", field="profile", hint="pip install 'dhp-planner[trainer]'."
        ) from None
    from trainer.profiler import ProfileSettings, measure_profile
    from trainer.tiny_model import TinyConfig

    if args.no_comm and not args.bandwidth:
        raise ProblemError(
            "--no-comm needs --bandwidth",
            field="--bandwidth",
            hint="give bytes per second, e.g. 5e9, or drop --no-comm.",
        )
    if args.threads is not None:
        if args.threads < 1:
            raise ProblemError(f"must be >= 1, got {args.threads}", field="--threads", hint="e.g. 1.")
        torch.set_num_threads(args.threads)
    if args.procs < 1:
        raise ProblemError(f"must be >= 1, got {args.procs}", field="--procs", hint="e.g. the ranks per node.")
    from trainer.model_profile import default_lengths, model_dims

    dims = model_dims(args.model_preset, args.model, args.hf_config)
    if args.lengths is None:
        args.lengths = ",".join(map(str, default_lengths(dims))) if dims else "128,256,512,1024,1536"
    if args.degrees is None:
        args.degrees = "1,2,3,4,6,8" if dims else "1,2,3,4"
    if dims is not None and not args.budget_s > 0:
        raise ProblemError(f"must be > 0, got {args.budget_s}", field="--budget-s", hint="e.g. 600.")
    try:
        cfg = TinyConfig(
            vocab=args.vocab,
            hidden=args.hidden,
            heads=args.heads,
            layers=args.layers,
            ffn_hidden=args.ffn_hidden,
            max_positions=max(4096, max(_ints("--lengths", args.lengths)) + 1),
        )
        settings = ProfileSettings(
            lengths=_ints("--lengths", args.lengths),
            degrees=_ints("--degrees", args.degrees),
            mixes=_ints("--mixes", args.mixes),
            repeats=args.repeats,
            warmup=args.warmup,
            device=args.device,
            dtype=args.dtype,
            comm=not args.no_comm,
            capacity_tokens=args.capacity_tokens,
            procs=args.procs,
            threads=args.threads,
            short_mix=args.short_mix,
            architecture=args.arch,
            kv_heads=args.kv_heads,
        )
    except ValueError as exc:
        raise ProblemError(str(exc), field="profile", hint="see dhp profile --help.") from None

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if not 0 < args.max_error or args.min_r2 > 1:
        raise ProblemError(
            f"--min-r2 {args.min_r2} / --max-error {args.max_error} cannot be met",
            field="--min-r2" if args.min_r2 > 1 else "--max-error",
            hint="R^2 is at most 1; the error is a positive fraction, e.g. 0.5.",
        )
    from trainer.profiler import FitRefused

    cluster = _cluster(args)
    try:
        if dims is None:
            profile, report = measure_profile(
                cfg, settings, progress, bandwidth=args.bandwidth, min_r2=args.min_r2, max_error=args.max_error
            )
        else:
            from trainer.model_profile import profile_model

            profile, report = profile_model(
                dims,
                settings,
                args.budget_s,
                progress,
                bandwidth=args.bandwidth,
                min_r2=args.min_r2,
                max_error=args.max_error,
            )
    except FitRefused as exc:
        if args.report:
            progress("no profile written: the fit was refused")
        raise ProblemError(f"refused the measured profile: {exc}", field=exc.field, hint=exc.hint) from None
    except ProblemError:
        raise
    except ValueError as exc:
        raise ProblemError(
            str(exc), field="--device" if "cuda" in str(exc) else "profile", hint="see dhp profile --help."
        ) from None
    from optimizer.problem.documents import profile_from_json
    from trainer.model_profile import inter_node_terms

    report["inter_node"] = inter_node_terms(profile, cluster)
    progress("inter-node terms: " + report["inter_node"])
    profile_from_json(profile)  # the file must be one `dhp plan --profile` accepts
    for depth, r in report.get("depths", {"": report}).items():
        held = r.get("held_out_mean_error")
        progress(
            (f"fit at {depth} block(s): " if depth else "fit: ")
            + f"R^2 {r['r2']:.4f}, largest relative error {r['max_rel_error']:.3f} over "
            f"{len(r['points'])} points (thresholds: R^2 >= {args.min_r2:g}, error <= {args.max_error:g})"
            + (
                f"; held-out points {held * 100:.1f}% mean, {r['held_out_worst_error'] * 100:.1f}% worst"
                if held is not None
                else ""
            )
            + f"; per-sample ring-step work {r['sample_step_s'] * 1e6:.1f} us"
        )
    if dims is not None:
        progress(
            f"{report['points']} points per depth in {report['elapsed_s']:.0f} s "
            f"(estimated {report['estimate_s']:.0f} s); extrapolated to {dims.layers} blocks"
        )
        report = {**report, **report["depths"][str(max(int(d) for d in report["depths"]))]}
    if report["transfers"]:
        progress(
            f"transfers: {report['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s, latency {report['latency_s'] * 1e6:.1f} us"
        )
    if "ring_r2" in report:
        progress(
            f"rings: R^2 {report['ring_r2']:.4f}, largest relative error {report['ring_max_rel_error']:.3f} over "
            f"{len(report['ring_points'])} points; {report['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s, "
            f"{report['latency_s'] * 1e6:.1f} us per message; "
            f"gradient all-reduce {report['step_constant_s'] * 1000:.2f} ms per step"
        )
    text = json.dumps(profile, indent=2)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
        progress(f"wrote {args.out}")
    else:
        print(text)
    if args.report:
        with open(args.report, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0
