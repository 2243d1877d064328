"""The refit loop on the torchrun trainer: feedback from a real training run turned into the profile it plans with.

For each process count (``--procs``, gloo on CPU) and each starting profile (the planner's analytical model,
and a deliberately wrong one: the trainer's built-in CPU profile with its compute, constants and bandwidth
moved by factors of 3 to 10), a planning service on loopback (SQLite under ``--out``) and
``trainer.train_hf`` under torchrun:

1. feedback steps planned with the newest profile (the starting one, then each refit); the trainer posts
   every step's time and per-group times (``POST /v1/plans/{id}/feedback``, its default with ``--service``)
   and asks for each plan when its step is about to run (``train_hf --no-plan-ahead``: on a CPU the search
   would otherwise share the timed step's cores; ``--plan-ahead`` plans while the previous step trains);
2. after 10, 20 and 50 of those steps (``--after``), ``POST /v1/profiles/fit`` over all of them (the plans
   of the starting profile and of its refits fit together);
   The first ``--skip`` steps of every run (one-time costs: allocations, the first communicators) are left
   out of the fits and of the errors;
3. evaluation runs of ``--eval-steps`` fresh batches (another seed: plans the fit never saw, made with the
   profile under test), planned with the starting profile and with each refitted one (``"profile":
   "learned:NAME"``): predicted against measured step time, mean and worst relative error, and the
   measured step time itself (what the better model buys); with ``--eval-repeats K`` every evaluation is run
   K times and each step's measured time is the median of the K; the newest profile's evaluation is run
   again (K times as well), and the spread of the same steps' measured times between the two is the timing
   noise.

``python -m bench.refit_trainer`` prints the table and writes ``refit_trainer.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from api.local_server import LocalServer, free_port

ROOT = Path(__file__).resolve().parent.parent
WRONG = {
    "time": {"quadratic": 2e-8, "linear": 2e-6, "sample_constant": 2e-2, "group_constant": 5e-4},
    "comm": {"scheme": "ring", "bytes_per_token": 3000, "bandwidth_bytes_per_s": {"intra": 5e9, "inter": 5e9}},
    "capacity_tokens_per_rank": 96,
    "source": "deliberately wrong: train_hf's default CPU profile, quadratic x10, linear /10, "
    "per-sample x10, per-group /10, bandwidth x10",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train(
    procs: int, profile: str, steps: int, seed: int, url: str, out: Path, args: argparse.Namespace
) -> dict[str, Any]:
    """One ``trainer.train_hf`` run planned through the service; rank 0's summary."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={procs}",
        f"--master-port={free_port()}",
        "-m",
        "trainer.train_hf",
        f"--steps={steps}",
        f"--seed={seed}",
        f"--samples={args.samples}",
        f"--shortest={args.shortest}",
        f"--longest={args.longest}",
        f"--hidden={args.hidden}",
        f"--layers={args.layers}",
        f"--heads={args.heads}",
        f"--kv-heads={args.kv_heads}",
        f"--capacity-tokens={args.capacity_tokens}",
        f"--profile={profile}",
        f"--service={url}",
        f"--budget-ms={args.budget_ms}",
        f"--out={out}",
    ]
    if not args.plan_ahead:
        cmd.append("--no-plan-ahead")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DHP_")}
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as fh:
        rc = subprocess.run(
            cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=args.timeout_s
        ).returncode
    if rc != 0 or not out.exists():
        tail = "\n".join(out.with_suffix(".log").read_text().splitlines()[-8:])
        raise SystemExit(f"train_hf on {procs} processes failed (exit {rc}); log {out.with_suffix('.log')}:\n{tail}")
    log(f"  {procs} procs, {steps} steps with {profile}: {time.perf_counter() - t0:.0f} s")
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def errors(summary: dict[str, Any], skip: int) -> dict[str, float]:
    """Predicted against measured step time over the run's steps after its first ``skip``."""
    rows = summary["steps"][skip:]
    rel = [abs(r["predicted_s"] / r["measured_s"] - 1) for r in rows]
    return {
        "steps": len(rows),
        "mean_error": sum(rel) / len(rel),
        "worst_error": max(rel),
        "mean_measured_s": sum(r["measured_s"] for r in rows) / len(rows),
        "mean_predicted_s": sum(r["predicted_s"] for r in rows) / len(rows),
    }


def median_run(repeats: list[dict[str, Any]]) -> dict[str, Any]:
    """One run of the same steps from ``repeats`` (runs of the same batches): each step's measured time the
    median over the runs whose plan of that step is the first run's (the same digest), its prediction the
    first run's; ``spread`` is each step's mean distance of those runs' times from that median."""
    steps = []
    for rows in zip(*(r["steps"] for r in repeats), strict=True):
        same = [r["measured_s"] for r in rows if r["digest"] == rows[0]["digest"]]
        middle = statistics.median(same)
        spread = sum(abs(x / middle - 1) for x in same) / len(same)
        steps.append({**rows[0], "measured_s": middle, "repeats": len(same), "spread": spread})
    return {**repeats[0], "steps": steps}


def run_start(procs: int, start: str, server: LocalServer, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The refit loop of one starting profile: feedback steps planned with the newest profile, a refit over all
    of them after each of ``--after`` steps, and an evaluation run of every profile."""
    tag = f"p{procs}-{Path(start).stem if start != 'analytical' else 'analytical'}"
    runs: dict[str, dict[str, Any]] = {}

    def measured(profile: str, name: str) -> dict[str, Any]:
        """The evaluation batches planned with ``profile``, run ``--eval-repeats`` times: their median run."""
        steps = args.eval_steps + args.skip
        return median_run(
            [
                train(procs, profile, steps, args.eval_seed, server.url, work / f"{tag}-{name}-r{k}.json", args)
                for k in range(args.eval_repeats)
            ]
        )

    def evaluate(profile: str, name: str) -> dict[str, float]:
        runs[name] = measured(profile, name)
        return errors(runs[name], args.skip)

    evals: dict[str, Any] = {"before": evaluate(start, "eval")}
    fits: dict[str, Any] = {}
    ids: list[str] = []
    current, done = start, 0
    for phase, k in enumerate(args.after):
        fed = train(
            procs,
            current,
            k - done + args.skip,
            args.seed + 1000 * phase,
            server.url,
            work / f"{tag}-feedback-{k}.json",
            args,
        )
        ids += [r["plan_id"] for r in fed["steps"]][args.skip :]
        done = k
        body = {"plan_ids": ids, "min_r2": args.min_r2, "max_error": args.max_error}
        r = httpx.post(server.url + "/v1/profiles/fit", json=body, timeout=120)
        if r.status_code != 201:
            fits[str(k)] = {"refused": r.json()}
            log(f"  fit over {k} steps refused: {r.json().get('detail')}")
            continue
        learned = r.json()
        fits[str(k)] = {"name": learned["name"], "fit": {x: learned["fit"][x] for x in ("points", "r2", "held_out")}}
        current = learned["reference"]
        evals[str(k)] = evaluate(current, f"eval-{k}")
    out = {"start": start, "feedback_steps": len(ids), "fits": fits, "eval": evals}
    if current != start:  # the newest profile's evaluation batches again: the timing noise of the same steps
        last = max(int(k) for k in evals if k != "before")
        again = measured(current, "again")
        pairs = list(zip(runs[f"eval-{last}"]["steps"][args.skip :], again["steps"][args.skip :], strict=True))
        spread = [abs(b["measured_s"] / a["measured_s"] - 1) for a, b in pairs]
        out["repeat"] = {"mean_spread": sum(spread) / len(spread), "worst_spread": max(spread)}
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.refit_trainer", description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", default="4,6", help="process counts (default 4,6)")
    ap.add_argument("--after", default="10,20,50", help="refit after this many feedback steps (default 10,20,50)")
    ap.add_argument("--eval-steps", type=int, default=10, help="fresh steps per evaluation run (default 10)")
    ap.add_argument(
        "--eval-repeats",
        type=int,
        default=1,
        help="runs of every evaluation; each step's measured time is their median (default 1)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-seed", type=int, default=2)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--shortest", type=int, default=32)
    ap.add_argument("--longest", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument(
        "--capacity-tokens", type=int, default=384, help="tokens per rank (default 384: long samples need groups)"
    )
    ap.add_argument(
        "--skip", type=int, default=2, help="first steps of every run left out of fits and errors (one-time costs)"
    )
    ap.add_argument(
        "--max-error", type=float, default=3.0, help="the fit's worst-group threshold (default 3.0: CPU timings)"
    )
    ap.add_argument("--budget-ms", type=int, default=300)
    ap.add_argument(
        "--plan-ahead",
        action="store_true",
        help="plan each step while the previous one trains (the trainer's default; off here: on a CPU the "
        "planner's search shares the cores the timed step runs on)",
    )
    ap.add_argument("--min-r2", type=float, default=0.5, help="the fit's R^2 threshold (default 0.5: CPU timings)")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=Path("bench-out/refit-trainer"))
    args = ap.parse_args(argv)
    if args.eval_repeats < 1:
        ap.error(f"--eval-repeats must be at least 1, not {args.eval_repeats}")
    args.after = [int(x) for x in args.after.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    wrong = args.out / "wrong-profile.json"
    wrong.write_text(json.dumps(WRONG, indent=1))
    results = []
    server = LocalServer(args.out / "service")
    try:
        for procs in [int(x) for x in args.procs.split(",")]:
            for start in ("analytical", str(wrong)):
                log(f"{procs} processes, starting from {Path(start).stem}:")
                results.append({"procs": procs, **run_start(procs, start, server, args, args.out)})
    finally:
        server.stop()
    (args.out / "refit_trainer.json").write_text(json.dumps({"cores": os.cpu_count(), "runs": results}, indent=1))
    print_table(results)


def print_table(results: list[dict[str, Any]]) -> None:
    print(f"{'procs':>5} {'start':<11} {'profile':<10} {'mean err':>9} {'worst err':>9} {'measured ms':>11}")
    spreads = []
    for r in results:
        start = "analytical" if r["start"] == "analytical" else "wrong"
        for when, e in r["eval"].items():
            label = "start" if when == "before" else f"refit@{when}"
            print(
                f"{r['procs']:>5} {start:<11} {label:<10} {e['mean_error']:>9.1%} {e['worst_error']:>9.1%} "
                f"{e['mean_measured_s'] * 1000:>11.1f}"
            )
        if "repeat" in r:
            spreads.append(
                f"{r['procs']} procs from {start}: {r['repeat']['mean_spread']:.1%} mean, "
                f"{r['repeat']['worst_spread']:.1%} worst"
            )
    if spreads:
        print("the same evaluation steps run again, measured step time against the first run:")
        print("\n".join("  " + x for x in spreads))


if __name__ == "__main__":
    main()
