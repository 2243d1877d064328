"""``dhp plan-epoch``: plan every step of an epoch into a plan file (see :mod:`jobs`).

Exit codes as for ``dhp plan``: 0 every step planned; 2 bad input, or a step with an invalid
sample; 3 a step no plan can satisfy (a sample too long for the cluster); the plan file is still
written with the other steps, and stderr names the failed steps and samples. 130 when interrupted:
run the same command again to resume.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from api.cli.request_flags import add_request_flags, request_parts
from optimizer.errors import ProblemError


def _add_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--dataset", help="samples, one a line (.jsonl) or one a row (.parquet): id, text_tokens, images, videos"
    )
    src.add_argument(
        "--batches", help='a JSON file with a list of batch documents (or {"batches": [...]}), one step each'
    )
    src.add_argument("--job", help="a job document (the body of POST /v1/jobs); flags given as well override it")
    p.add_argument("--global-batch-size", type=int, help="samples per step (with --dataset)")
    p.add_argument(
        "--sampler", choices=["sequential", "shuffle", "length-grouped"], help="sample order (default sequential)"
    )
    p.add_argument("--seed", type=int, help="sampler seed (default 0)")
    p.add_argument("--epoch", type=int, help="epoch number, mixed into the seed (default 0)")
    p.add_argument(
        "--group-batches", type=int, help="length-grouped: steps' worth of samples sorted together (default 16)"
    )
    p.add_argument(
        "--drop-last", action="store_true", default=None, help="drop a last step shorter than the global batch size"
    )
    p.add_argument("--max-steps", type=int, help="plan only the first N steps")
    add_request_flags(
        p,
        "options file (the 'options' document of a request); jobs default to backend heuristic with a "
        "60000 ms budget per step, a cap the heuristic does not reach",
    )
    p.add_argument(
        "--engine", choices=["local", "ray"], default="local", help="local process pool (default) or Ray tasks"
    )
    p.add_argument(
        "--workers",
        type=int,
        help="processes (local; default: the CPU count) or most Ray tasks at once (default: the cluster's CPUs)",
    )
    p.add_argument("--address", help="Ray cluster address (host:port or 'auto'); default: start a local Ray instance")
    p.add_argument(
        "--out", required=True, help="output directory: plan.parquet, index.json (and journal.jsonl while running)"
    )
    p.add_argument(
        "--fresh", action="store_true", help="discard the progress of an earlier run in --out instead of resuming it"
    )
    p.add_argument(
        "--keep-journal",
        action="store_true",
        help="keep the journal (as journal.jsonl.done) after the plan file is written",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def job_document(args: argparse.Namespace) -> dict[str, Any]:
    """The job document the flags describe (the shape of a POST /v1/jobs body, plus a dataset path)."""
    from optimizer.problem.documents import read_json_file

    doc: dict[str, Any] = {}
    if args.job:
        doc = dict(read_json_file(args.job, "--job"))
    elif args.dataset:
        doc["dataset"] = {"path": args.dataset}
    else:
        batches = read_json_file(args.batches, "--batches")
        doc["batches"] = batches.get("batches") if isinstance(batches, dict) else batches
    sampler = dict(doc.get("sampler") or {})
    for flag, key in (("sampler", "kind"), ("seed", "seed"), ("epoch", "epoch"), ("group_batches", "group_batches")):
        if getattr(args, flag) is not None:
            sampler[key] = getattr(args, flag)
    if sampler:
        doc["sampler"] = sampler
    for flag, key in (
        ("global_batch_size", "global_batch_size"),
        ("drop_last", "drop_last"),
        ("max_steps", "max_steps"),
    ):
        if getattr(args, flag) is not None:
            doc[key] = getattr(args, flag)
    doc.update(request_parts(args, doc.get("options")))
    return doc


def _workers(value: Any) -> int | None:
    """A job document's ``workers`` (what POST /v1/jobs takes), checked; None when it is left out."""
    from jobs.spec import MAX_WORKERS

    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise ProblemError(
            f"must be an integer from 1 to {MAX_WORKERS}, got {value!r}",
            field="workers",
            hint="give the number of worker processes, e.g. 2, or leave it out (the CPU count).",
        )
    return value


class _Bar:
    def __init__(self, enabled: bool) -> None:
        self.bar: Any = None
        self.enabled = enabled

    def __call__(self, done: int, total: int, failed: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:  # no bar without tqdm; the job runs the same
                self.enabled = False
                return
            self.bar = tqdm(
                total=total, initial=done, unit="step", desc="planning", dynamic_ncols=True, file=sys.stderr
            )
        self.bar.n = done
        self.bar.set_postfix(failed=failed, refresh=False)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_plan_epoch(args: argparse.Namespace) -> int:
    from jobs.engines import make_engine
    from jobs.epoch_summary import summary_text
    from jobs.runner import run_job
    from jobs.spec import job_from_json
    from jobs.steps import build_epoch

    try:
        import pyarrow  # noqa: F401  (the plan file)
    except ImportError:
        raise ProblemError(
            "needs pyarrow to write the plan file", field="plan-epoch", hint="pip install 'dhp-planner[jobs]'."
        ) from None
    if args.workers is not None and args.workers < 1:
        raise ProblemError(
            f"must be >= 1, got {args.workers}", field="--workers", hint="give the number of worker processes, e.g. 2."
        )
    if args.address and args.engine != "ray":
        raise ProblemError(
            "applies to --engine ray only", field="--address", hint="add --engine ray, or drop --address."
        )
    doc = job_document(args)
    workers = _workers(doc.pop("workers", None)) if args.workers is None else args.workers
    epoch = build_epoch(job_from_json(doc))
    engine = make_engine(args.engine, workers, args.address)
    bar = _Bar(not args.no_progress)
    try:
        result = run_job(epoch, args.out, engine, progress=bar, fresh=args.fresh, keep_journal=args.keep_journal)
    except KeyboardInterrupt:
        bar.close()
        print(f"interrupted; run the same command again to resume from {args.out}/journal.jsonl", file=sys.stderr)
        return 130
    finally:
        bar.close()
        engine.close()
    assert result.index is not None
    summary = result.index["summary"]
    if args.json:
        print(
            json.dumps(
                {"summary": summary, "run": result.index["run"], "plan_file_sha256": result.index["plan_file_sha256"]},
                indent=2,
            )
        )
    else:
        print(summary_text(summary))
        run = result.index["run"]
        print(
            f"wrote {result.directory}/plan.parquet ({result.total} steps; planned now {result.planned_now}, "
            f"reused {result.reused}; {run['engine']} x{run['workers']} in {result.wall_s:.1f} s)"
        )
    if summary["failed"]:
        for f in summary["failures"][:5]:
            sample = f" sample {f['sample']!r}" if f.get("sample") else ""
            print(
                (
                    f"error: step {f['step']}{sample}: {f.get('field') or ''}: {f['message']} To fix: "
                    f"{f.get('hint') or ''}"
                ),
                file=sys.stderr,
            )
        kinds = {f["kind"] for f in summary["failures"]}
        return 2 if "invalid" in kinds or "internal" in kinds else 3
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "plan-epoch", help="plan every step of an epoch ahead into a Parquet plan file (local processes or Ray)"
    )
    _add_args(p)
    p.set_defaults(func=cmd_plan_epoch)
