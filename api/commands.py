"""The ``dhp`` command line.

Exit codes: 0 success; 1 a plan failed validation (``dhp validate``); 2 bad input (the message
names the field and says how to fix it); 3 the input is valid but no plan can satisfy it; 4 an I/O
failure (the output could not be written: a missing folder, a full disk, standard output closed).
Every failure is one line on standard error, never a traceback.
Subcommands of other parts (``serve``, ``bench``, ``profile``) are added when those parts are
installed.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from optimizer.errors import InfeasibleError, PlannerError
from planning.request_flags import add_request_flags, request_parts

EXTENSIONS = ("api.cli", "bench.cli", "trainer.cli", "jobs.cli")
"""Modules that may add subcommands through a function ``register(subparsers)``."""


def _problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", required=True, help="batch file: {\"samples\": [{\"id\", \"text_tokens\", \"images\": [{\"tokens\"}]}]}")
    add_request_flags(p)


def build_request(args: argparse.Namespace) -> dict[str, Any]:
    """The request document the flags describe (the same shape as a POST /v1/plans body)."""
    from optimizer.problem.documents import read_json_file

    return {"batch": read_json_file(args.batch, "--batch"), **request_parts(args)}


def cmd_plan(args: argparse.Namespace) -> int:
    from optimizer.plan.summary import summary_text
    from optimizer.problem.documents import problem_from_json
    from planning.planner import plan

    problem = problem_from_json(build_request(args))
    if args.show_profile:
        emit(json.dumps(problem.cost_profile.to_json(), indent=2))
        return 0
    result = plan(problem)
    text = summary_text(result, problem) if args.summary else json.dumps(result.to_json(shards=not args.no_shards), indent=None if args.compact else 2)
    emit(text, args.out)
    return 0


def emit(text: str, out: str | None = None) -> None:
    """Write ``text`` to the file ``out`` or to standard output, so that any failure to write surfaces here
    (as OSError, exit 4) rather than being lost: a closed standard output, a full disk, a missing folder."""
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
            fh.flush()
            if os.path.isfile(out):  # a full disk may only say so when the data reaches it
                os.fsync(fh.fileno())
        return
    if sys.stdout is None:
        raise OSError(errno.EBADF, "standard output is closed")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def cmd_validate(args: argparse.Namespace) -> int:
    from optimizer.problem.documents import problem_from_json, read_json_file
    from optimizer.verify.plan_document import check_plan_document

    problem = problem_from_json(build_request(args))
    doc = read_json_file(args.plan, "--plan")
    report = check_plan_document(problem, doc)
    if report.ok:
        emit(f"valid: {len(doc['micro_batches'])} micro-batches, step time {report.step_time_s:.6g} s")
        return 0
    emit("\n".join(f"invalid: {v}" for v in report.violations))
    return 1


def cmd_presets(args: argparse.Namespace) -> int:
    from optimizer.costs.zoo import describe_presets

    presets = describe_presets()
    if args.json:
        emit(json.dumps(presets, indent=2))
        return 0
    emit("\n".join(f"{kind}: {', '.join(sorted(presets[kind]))}" for kind in ("clusters", "models", "gpus", "profiles")))
    return 0


def cmd_example(args: argparse.Namespace) -> int:
    from optimizer.problem.workloads import WORKLOADS

    emit(json.dumps(WORKLOADS[args.workload](args.samples, seed=args.seed)))
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dhp", description="Plan dynamic hybrid (data x context) parallelism for a training batch.", epilog=EXIT_CODES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="plan a batch and print the plan as JSON (or a summary)")
    _problem_args(p)
    p.add_argument("--summary", action="store_true", help="print a readable summary instead of JSON")
    p.add_argument("--no-shards", action="store_true", help="leave out each sample's token ranges per rank")
    p.add_argument("--compact", action="store_true", help="JSON on one line")
    p.add_argument("--show-profile", action="store_true", help="print the cost profile in force and exit")
    p.add_argument("--out", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_plan)

    v = sub.add_parser("validate", help="verify a plan file against its batch and cluster")
    v.add_argument("--plan", required=True, help="a plan printed by 'dhp plan'")
    _problem_args(v)
    v.set_defaults(func=cmd_validate)

    pr = sub.add_parser("presets", help="list the preset clusters, models and GPU types")
    pr.add_argument("--json", action="store_true", help="print every preset document")
    pr.set_defaults(func=cmd_presets)

    from optimizer.problem.workloads import WORKLOADS

    ex = sub.add_parser("example", help="print a generated batch file")
    ex.add_argument("--workload", choices=sorted(WORKLOADS), default="video")
    ex.add_argument("--samples", type=int, default=512)
    ex.add_argument("--seed", type=int, default=0)
    ex.set_defaults(func=cmd_example)

    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(sub)
    return ap


EXIT_CODES = """exit codes:
  0  success
  1  the plan failed validation (dhp validate)
  2  bad input: one line on stderr naming the field and how to fix it
  3  valid input that no plan can satisfy
  4  I/O failure: the output could not be written (missing folder, full disk, closed stdout)"""


def _fail(message: str, code: int) -> int:
    if sys.stderr is not None:
        try:
            print(f"error: {message}", file=sys.stderr)
        except OSError:
            pass
    return code


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InfeasibleError as exc:
        return _fail(str(exc), 3)
    except PlannerError as exc:
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (e.g. `head`) went away; nothing is lost
        if sys.stderr is not None:
            sys.stderr.close()
        return 0
    except OSError as exc:
        where = f" {exc.filename}" if exc.filename else ""
        return _fail(f"cannot write{where}: {exc.strerror or exc}", 4)


if __name__ == "__main__":
    sys.exit(main())
