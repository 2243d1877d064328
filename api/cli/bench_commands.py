"""``dhp bench``: the benchmark grid against static and dynamic baselines, and the scaling run.

Writes ``results.json``, ``report.md`` and PNG plots into ``--out`` (``scaling.json``,
``scaling.png`` too with ``--scaling``); progress goes to stderr. ``--quick`` runs a small grid
(about a minute on two cores).

``--suite flexsp`` runs the grid of dhp against the real FlexSP solver (:mod:`bench.versus`): five
workloads x 3 seeds x 64 and 256 ranks x 512 samples x five profiles, printing a table per case and
the summary lines; with ``--quick`` one small case (the CI test runs it). ``--profiles`` runs any
grid under zoo profiles or profile files (``analytical`` is the default).

``--suite megatron`` runs dhp as Megatron-Core's scheduler against Megatron-Core's own
(:mod:`bench.versus_megatron`; needs megatron-core): five workloads x 3 seeds x 64 and 256 ranks x
512 samples x three profiles, under Megatron's rules; with ``--quick`` one small case.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

QUICK = {"ranks": (8, 64), "samples_per_rank": (8,), "seeds": 2, "repeats": 2, "budget_ms": 200.0, "max_samples": 512}
QUICK_SCALING = ((64, 512), (256, 2048))


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers (e.g. 8,64,512)"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 8,64,512")
    return values


def _csv(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values:
        raise argparse.ArgumentTypeError("give at least one name")
    return values


def register(subparsers: Any) -> None:
    b = subparsers.add_parser(
        "bench",
        help="benchmark the planner against static and dynamic baselines (JSON, Markdown, PNG)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="small grid: 8 and 64 ranks, 8 samples per rank, 2 batches (about a minute)",
    )
    b.add_argument("--out", default="bench-results", help="results folder (default bench-results)")
    b.add_argument(
        "--workloads",
        type=_csv,
        help=(
            "comma-separated workloads (video,image-sft,anyres,dynamic-res,long-text,mixed) or replay files "
            "(.json/.csv)"
        ),
    )
    b.add_argument("--ranks", type=_csv_ints, help="comma-separated cluster sizes (default 8,64,512,4096)")
    b.add_argument("--samples-per-rank", type=_csv_ints, help="batch sizes as samples per rank (default 2,8)")
    b.add_argument("--max-samples", type=int, help="skip cells with more samples (default 8192)")
    b.add_argument("--seeds", type=int, help="seeded batches per cell (default 3)")
    b.add_argument("--repeats", type=int, help="timed calls per batch after the warm-up (default 3)")
    b.add_argument("--budget-ms", type=float, help="budget of the exact backend and of the bucket MILP (default 1000)")
    b.add_argument(
        "--suite",
        choices=["baselines", "flexsp", "megatron"],
        default="baselines",
        help="baselines: every planner on the workload grid (default); flexsp: dhp against the real "
        "FlexSP solver; megatron: dhp against Megatron-Core's scheduler (see above)",
    )
    b.add_argument(
        "--profiles",
        type=_csv,
        help="comma-separated cost profiles: analytical, zoo names (dhp presets) or profile files (.json)",
    )
    b.add_argument("--samples", type=_csv_ints, help="batch sizes in samples (replace --samples-per-rank)")
    b.add_argument(
        "--flexsp-src",
        help="folder holding FlexSP's galvatron/flexsp_solver (default ../shared/peers/flexsp beside the repository)",
    )
    b.add_argument(
        "--flexsp-time-limit",
        type=float,
        help=(
            "SCIP time limit per FlexSP MILP in seconds (default 10, as its scripts; "
            "1 with --quick in the flexsp suite)"
        ),
    )
    b.add_argument("--flexsp-workers", type=int, help="most processes FlexSP's pools start (default 2)")
    b.add_argument(
        "--flexsp-cache",
        help=(
            "folder keeping FlexSP's answers by their inputs: a re-run reuses them (FlexSP does not depend on dhp's "
            "planner)"
        ),
    )
    b.add_argument(
        "--flexsp-from",
        help=(
            "results.json of an earlier flexsp-suite run: FlexSP's answers are taken from it, batch by batch, instead "
            "of running the solver (same FlexSP settings; FlexSP does not depend on dhp's planner)"
        ),
    )
    b.add_argument(
        "--planners", type=_csv, help="comma-separated planners (default: all; dhp-auto only with an exact backend)"
    )
    b.add_argument("--no-memory", action="store_true", help="skip the tracemalloc peak-memory call")
    b.add_argument(
        "--scaling", action="store_true", help="also measure heuristic planning cost up to 8192 ranks x 65536 samples"
    )
    b.add_argument("--scaling-only", action="store_true", help="run only the scaling measurement")
    b.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from tqdm import tqdm

    from bench.grid import GridSpec, run_grid, total_steps
    from bench.report import write_report
    from optimizer.errors import ProblemError

    command = (
        "dhp " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        if sys.argv and Path(sys.argv[0]).name == "dhp"
        else "dhp bench " + " ".join(shlex.quote(a) for a in _echo(args))
    )
    from bench.flexsp_real import FlexSPSettings, require

    out = Path(args.out)
    from bench import versus, versus_megatron

    suite = getattr(args, "suite", "baselines")
    if suite == "flexsp":
        kwargs: dict[str, Any] = dict(versus.QUICK if args.quick else versus.FULL)
    elif suite == "megatron":
        kwargs = dict(versus_megatron.QUICK if args.quick else versus_megatron.FULL)
    else:
        kwargs = dict(QUICK) if args.quick else {}
    for key in (
        "workloads",
        "ranks",
        "samples_per_rank",
        "samples",
        "max_samples",
        "seeds",
        "repeats",
        "budget_ms",
        "planners",
        "profiles",
    ):
        value = getattr(args, key)
        if value is not None:
            kwargs[key] = value
    if args.no_memory:
        kwargs["memory"] = False
    if args.max_samples is not None and args.max_samples < 1:
        raise ProblemError(
            f"must be >= 1, got {args.max_samples}", field="--max-samples", hint="e.g. --max-samples 8192."
        )
    if args.budget_ms is not None and not 1 <= args.budget_ms <= 600_000:
        raise ProblemError(
            f"must be from 1 to 600000 ms, got {args.budget_ms}", field="--budget-ms", hint="e.g. --budget-ms 1000."
        )
    if args.workloads:
        from bench.workload_catalog import get_workload

        for w in args.workloads:
            get_workload(w)
    limit = args.flexsp_time_limit
    if limit is None:
        limit = versus.QUICK_TIME_LIMIT_S if suite == "flexsp" and args.quick else 10.0
    kwargs["flexsp"] = FlexSPSettings(
        src=args.flexsp_src,
        time_limit_s=limit,
        workers=2 if args.flexsp_workers is None else args.flexsp_workers,
        cache=args.flexsp_cache,
        reuse=args.flexsp_from,
    )
    if "flexsp" in kwargs.get("planners", ()) and not args.scaling_only:
        require(kwargs["flexsp"])
    if suite == "megatron" and "megatron" in kwargs["planners"] and not args.scaling_only:
        from bench.baselines.megatron_real import available
        from trainer.megatron import INSTALL_HINT

        if not available():
            raise ProblemError(
                "the megatron suite needs megatron-core, which is not installed",
                field="--suite",
                hint=INSTALL_HINT + ".",
            )
    out.mkdir(parents=True, exist_ok=True)
    if not args.scaling_only and suite == "megatron":
        spec = GridSpec(**kwargs)
        with tqdm(
            total=total_steps(spec), desc="bench megatron", unit="plan", file=sys.stderr, dynamic_ncols=True
        ) as bar:
            doc = run_grid(spec, progress=bar.update)
        _, lines = versus_megatron.write(doc, out, command)
        print("\n".join(lines))
        print(f"wrote {out / 'results.json'}, {out / 'report.md'} and plots")
    elif not args.scaling_only and suite == "flexsp":
        spec = GridSpec(**kwargs)
        with tqdm(
            total=total_steps(spec), desc="bench flexsp", unit="plan", file=sys.stderr, dynamic_ncols=True
        ) as bar:
            doc = run_grid(spec, progress=bar.update)
        _, lines = versus.write(doc, out, command)
        print("\n".join(lines))
        print(f"wrote {out / 'results.json'}, {out / 'report.md'} and plots")
    elif not args.scaling_only:
        spec = GridSpec(**kwargs)
        with tqdm(total=total_steps(spec), desc="bench", unit="plan", file=sys.stderr, dynamic_ncols=True) as bar:
            doc = run_grid(spec, progress=bar.update)
        summary = write_report(doc, out, command)
        g = summary["goals"]
        print(f"wrote {out / 'results.json'}, {out / 'report.md'} and plots")
        if g:
            print(
                f"dhp heuristic: video speedup over static at its best {g.get('video_speedup_over_static_best')}, "
                f"over static as deployed {g.get('video_speedup_over_static_deployed')}, "
                f"median ratio to bound {g.get('median_ratio_to_bound')}"
            )
    if args.scaling or args.scaling_only:
        from bench import scaling

        points = QUICK_SCALING if args.quick else scaling.DIAGONAL
        with tqdm(total=len(points), desc="scaling", unit="point", file=sys.stderr) as bar:
            sdoc = scaling.run_scaling(points, progress=bar.update)
        sdoc["command"] = command
        (out / "scaling.json").write_text(json.dumps(sdoc, indent=1))
        scaling.plot(sdoc, out / "scaling.png")
        text = scaling.markdown(sdoc)
        (out / "scaling.md").write_text(text + "\n![scaling](scaling.png)\n")
        print(text)
    return 0


def _echo(args: argparse.Namespace) -> list[str]:
    """The flags that were given, as a command line (for the report)."""
    words = []
    for key, value in sorted(vars(args).items()):
        if key in ("func", "command") or value in (None, False):
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            words.append(flag)
        elif isinstance(value, tuple):
            words += [flag, ",".join(map(str, value))]
        else:
            words += [flag, str(value)]
    return words
