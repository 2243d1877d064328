"""Measured step times of four plan sources in a real training loop, and their losses compared.

    .venv/bin/python -m bench.megatron_e2e                       # fit the profile, time the arms, check the losses
    .venv/bin/python -m bench.megatron_e2e --profile profile.json --steps 20 --out-dir docs/results-megatron-e2e

The trainer is ``trainer.train_hf`` under torchrun (gloo on CPU), a small Hugging Face Llama, the
same seeded batches and the same initial model in every arm (:mod:`trainer.arms`):

- (a) ``static``: the best static power-of-two layout, packed execution;
- (b) ``megatron``: Megatron-Core's ``BalancedCPScheduler`` schedule, run per sample as Megatron runs it;
- (c) ``dhp-megatron``: dhp under Megatron's rules (``PlannedCPScheduler``), per sample;
- (d) ``dhp``: dhp under its own rules, packed.

What it does, in order (progress on stderr):

1. the profile: ``dhp profile --arch llama`` fits the trainer's model at its dimensions on
   ``--procs`` processes (or ``--profile FILE``); arms (a) and (d) plan with it;
2. the barrier: a barrier over ``--procs`` gloo processes is timed
   (:func:`trainer.per_sample_costs.measure_barrier`); with the fitted profile it gives the
   per-sample profile of arms (b) and (c) (:func:`trainer.per_sample_costs.per_sample_profile`,
   whose docstring says where each number comes from);
3. timing: each arm trains ``--warmup`` + ``--steps`` steps on ``--procs`` processes (default one
   per core: more processes than cores time-share and a step's time becomes their sum), and every
   counted step records the plan's predicted step time, the measured one (the slowest rank) and the
   loss;
4. correctness: each arm trains ``--check-steps`` steps in float64 on ``--check-procs`` processes
   (4) with the one-process reference beside it; the per-step losses of the arms are compared.

It writes ``e2e.json`` (every step of every run, the profiles, the settings) and ``e2e.md`` (the
table: per arm median and mean measured step time, predicted beside it and their error, speedups
over (a) and (b), measured and predicted; the loss check) in ``--out-dir``, and the trainer's logs
under ``logs/``.

Batches mix short and long samples: ``--samples`` per step of log-uniform lengths from
``--shortest`` to ``--longest`` (default: as many times ``--capacity-tokens`` as the widest power of
two of ranks up to 4 allows, so the longest samples need context parallelism and Megatron's
scheduler can still place them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ARM_ORDER = ("static", "megatron", "dhp-megatron", "dhp")
LABELS = {"static": "(a) static", "megatron": "(b) megatron", "dhp-megatron": "(c) dhp-megatron", "dhp": "(d) dhp"}
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 2e-2}
"""Largest relative loss difference between arms that counts as equal, by dtype."""
STEP_LINE = re.compile(r"^\[(\S+)\] step (\d+): loss ([^\s,]+).*predicted (\S+) ms, measured (\S+) ms")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def widest_power_of_two(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--procs", type=int, default=os.cpu_count() or 1, help="processes of the timed runs (default: one per core)")
    add("--steps", type=int, default=20, help="timed steps per arm (default 20)")
    add("--warmup", type=int, default=3, help="steps per arm before the timed ones, not counted (default 3)")
    add("--samples", type=int, default=16, help="samples per step (default 16)")
    add("--shortest", type=int, default=32)
    add("--longest", type=int, help="longest sample (default: capacity x the widest power of two of ranks, at most 4)")
    add("--capacity-tokens", type=int, default=1024, help="tokens a rank holds (default 1024)")
    add("--seed", type=int, default=0)
    add("--hidden", type=int, default=128)
    add("--layers", type=int, default=2)
    add("--heads", type=int, default=8)
    add("--kv-heads", type=int, default=2)
    add("--budget-ms", type=int, default=300, help="planning budget of a batch (default 300)")
    add("--profile", help="a profile of this model from dhp profile (default: fit one now)")
    add("--profile-repeats", type=int, default=3, help="timed runs per point of the fit (default 3)")
    add("--profile-extra", default="", help="more flags for dhp profile, e.g. '--min-r2 0.8'")
    add("--barrier-s", type=float, help="seconds of a barrier over --procs processes (default: timed now)")
    add("--arms", default=",".join(ARM_ORDER), help="arms to run, comma-separated (default all four)")
    add("--check-procs", type=int, default=4, help="processes of the loss check (default 4; 0: no check)")
    add("--check-steps", type=int, default=3, help="steps of the loss check (default 3)")
    add("--check-dtype", choices=list(TOLERANCE), default="float64")
    add("--timeout-s", type=float, default=1800.0, help="longest a single training run may take (default 1800)")
    add("--out-dir", default="docs/results-megatron-e2e", help="where e2e.json, e2e.md and logs/ go")
    args = ap.parse_args(argv)
    positive = (
        "procs",
        "steps",
        "samples",
        "shortest",
        "capacity_tokens",
        "hidden",
        "layers",
        "heads",
        "kv_heads",
        "budget_ms",
        "profile_repeats",
    )
    for name in positive:
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or args.check_procs < 0 or args.check_steps < 1:
        ap.error("--warmup and --check-procs must be >= 0, --check-steps >= 1")
    if args.longest is None:
        args.longest = args.capacity_tokens * min(4, widest_power_of_two(args.procs))
    widest = widest_power_of_two(min(args.procs, args.check_procs) if args.check_procs else args.procs)
    if args.longest > args.capacity_tokens * widest:
        ap.error(
            f"--longest {args.longest} needs more than {widest} ranks of {args.capacity_tokens} tokens, which "
            f"Megatron's scheduler cannot place; give --longest <= {args.capacity_tokens * widest} or raise "
            "--capacity-tokens"
        )
    if args.longest < args.shortest:
        ap.error("--longest must be >= --shortest")
    most = max(args.procs, args.check_procs)
    if args.samples < most:
        ap.error(f"--samples must be at least the processes ({most}): Megatron's scheduler gives every rank a sample")
    if args.hidden % args.heads or args.heads % args.kv_heads:
        ap.error("--hidden must be a multiple of --heads, and --heads a multiple of --kv-heads")
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in args.arm_list if a not in ARM_ORDER]
    if unknown or not args.arm_list:
        ap.error(f"unknown arm(s) {unknown}; choose from {','.join(ARM_ORDER)}")
    return args


# -- the profile ------------------------------------------------------------------------------


def profile_lengths(shortest: int, longest: int) -> list[int]:
    """Five lengths, geometric from max(shortest, 64) to the longest sample (the fit's range)."""
    low = min(max(shortest, 64), longest)
    return sorted({int(round(low * (longest / low) ** (k / 4))) for k in range(5)})


def profile_degrees(procs: int) -> list[int]:
    """Group sizes to fit: 1 to 4 and every power of two up to the processes, and the processes."""
    powers = {1 << k for k in range(procs.bit_length()) if 1 << k <= procs}
    return sorted(set(range(1, min(procs, 4) + 1)) | powers | {procs})


def flags(**values: Any) -> list[str]:
    """Command-line flags of keyword values (``kv_heads=2`` -> ``--kv-heads 2``)."""
    return [x for key, value in values.items() for x in (f"--{key.replace('_', '-')}", str(value))]


def fit_profile(args: argparse.Namespace, out_dir: Path) -> tuple[Path, dict[str, Any] | None]:
    """Run ``dhp profile`` for the trainer's model; returns (profile file, fit report)."""
    path, report = out_dir / "profile.json", out_dir / "profile_report.json"
    cmd = [
        sys.executable,
        "-m",
        "api.cli.main",
        "profile",
        *flags(
            arch="llama",
            device="cpu",
            threads=1,
            procs=args.procs,
            hidden=args.hidden,
            heads=args.heads,
            kv_heads=args.kv_heads,
            layers=args.layers,
            ffn_hidden=2 * args.hidden,
            vocab=96,
            lengths=",".join(map(str, profile_lengths(args.shortest, args.longest))),
            degrees=",".join(map(str, profile_degrees(args.procs))),
            repeats=args.profile_repeats,
            capacity_tokens=args.capacity_tokens,
            out=path,
            report=report,
        ),
        *shlex.split(args.profile_extra),
    ]
    log(f"fitting the profile: {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
    (out_dir / "logs").mkdir(exist_ok=True)
    (out_dir / "logs" / "profile.log").write_text(res.stderr)
    if res.returncode != 0:
        last = [line for line in res.stderr.splitlines() if line.strip()][-1:] or ["(no output)"]
        raise SystemExit(
            f"dhp profile failed (exit {res.returncode}): {last[0]} -- rerun on a quiet machine, raise "
            "--profile-repeats, pass flags with --profile-extra, or give --profile FILE"
        )
    for line in res.stderr.splitlines():
        if line.startswith(("fit:", "rings:", "transfers:")):
            log(f"  {line}")
    log(f"  profile fitted in {time.perf_counter() - t0:.0f} s -> {path}")
    return path, json.loads(report.read_text())


# -- the runs ---------------------------------------------------------------------------------


def _env() -> dict[str, str]:
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def train(
    arm: str,
    procs: int,
    steps: int,
    dtype: str,
    args: argparse.Namespace,
    profile: Path,
    barrier_s: float,
    out: Path,
    reference: bool = False,
) -> dict[str, Any]:
    """One ``trainer.train_hf`` run of an arm under torchrun; returns its summary (rank 0's ``--out``)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *flags(nproc_per_node=procs, master_port=_free_port()),
        "-m",
        "trainer.train_hf",
        *flags(
            arm=arm,
            steps=steps,
            samples=args.samples,
            shortest=args.shortest,
            longest=args.longest,
            seed=args.seed,
            dtype=dtype,
            hidden=args.hidden,
            layers=args.layers,
            heads=args.heads,
            kv_heads=args.kv_heads,
            profile=profile,
            capacity_tokens=args.capacity_tokens,
            budget_ms=args.budget_ms,
            barrier_s=repr(barrier_s),
            out=out,
        ),
    ]
    if reference:
        cmd.append("--reference")
    logs = out.parent / "logs"
    logs.mkdir(exist_ok=True)
    log_path = logs / f"{out.stem}.log"
    t0 = time.perf_counter()
    with open(log_path, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.PIPE, text=True)
        watchdog = threading.Timer(args.timeout_s, proc.kill)
        watchdog.start()
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                fh.write(line)
                if line.startswith(f"[{arm}] step") or line.startswith("after "):
                    log("  " + _short(line.rstrip()))
            rc = proc.wait()
        finally:
            watchdog.cancel()
    if time.perf_counter() - t0 >= args.timeout_s:
        raise SystemExit(f"the {arm} run passed --timeout-s {args.timeout_s:g} and was stopped; its log is {log_path}")
    if rc != 0 or not out.exists():
        tail = "\n".join(log_path.read_text().splitlines()[-5:])
        raise SystemExit(f"the {arm} run on {procs} processes failed (exit {rc}); its log is {log_path}:\n{tail}")
    log(f"  {arm}: {steps} steps on {procs} processes in {time.perf_counter() - t0:.0f} s")
    summary: dict[str, Any] = json.loads(out.read_text())
    return summary


def _short(line: str) -> str:
    """A trainer step line without its per-group details."""
    m = STEP_LINE.match(line)
    return line if m is None else f"{m[1]} step {m[2]}: loss {m[3]}, predicted {m[4]} ms, measured {m[5]} ms"


# -- the record and its table -----------------------------------------------------------------


def arm_figures(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians, means and the prediction error of an arm's counted steps."""
    measured = [float(s["measured_s"]) for s in steps]
    predicted = [float(s["predicted_s"]) for s in steps]
    errors = [p / m - 1.0 for p, m in zip(predicted, measured, strict=True)]
    # Each group's own time (the slowest of its ranks, barriers excluded) against its prediction.
    per_micro_batch = [
        pair for s in steps for pair in zip(s.get("group_times_s", []), s.get("group_predicted_s", []), strict=True)
    ]
    pairs = [(m, p) for ms, ps in per_micro_batch for m, p in zip(ms, ps, strict=True)]
    groups = [p / m - 1.0 for m, p in pairs if m > 0 and p is not None]
    mean = statistics.fmean
    return {
        "steps": len(steps),
        "measured_median_s": statistics.median(measured),
        "measured_mean_s": mean(measured),
        "predicted_median_s": statistics.median(predicted),
        "predicted_mean_s": mean(predicted),
        "error_of_means": mean(predicted) / mean(measured) - 1.0,
        "mean_abs_step_error": mean(abs(e) for e in errors),
        "worst_step_error": max(errors, key=abs),
        "mean_abs_group_error": mean(abs(e) for e in groups) if groups else None,
        "micro_batches_mean": mean(len(s["groups"]) for s in steps),
        "verified": all((s.get("verification") or {}).get("ok", True) for s in steps),
    }


def loss_check(runs: dict[str, dict[str, Any]], dtype: str) -> dict[str, Any]:
    """The largest relative difference of any two arms' losses at the same step, and each arm's against one process."""
    arms = list(runs)
    losses = {a: [float(s["loss"]) for s in runs[a]["steps"]] for a in arms}
    n = min(len(v) for v in losses.values())
    worst = 0.0
    for k in range(n):
        values = [losses[a][k] for a in arms]
        scale = max(abs(v) for v in values) or 1.0
        worst = max(worst, (max(values) - min(values)) / scale)
    reference = {a: runs[a].get("max_loss_rel_diff") for a in arms}
    ok = worst <= TOLERANCE[dtype] and all(v is None or v <= TOLERANCE[dtype] for v in reference.values())
    return {
        "dtype": dtype,
        "steps": n,
        "losses": losses,
        "max_rel_diff_between_arms": worst,
        "max_rel_diff_to_one_process": reference,
        "tolerance": TOLERANCE[dtype],
        "equal": ok,
    }


def summarise(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per arm figures of a record, with speedups over (a) and (b) where they ran."""
    out = {arm: arm_figures(run["steps"]) for arm, run in record["timing"].items()}
    for base in ("static", "megatron"):
        if base not in out:
            continue
        for fig in out.values():
            fig[f"speedup_over_{base}"] = out[base]["measured_mean_s"] / fig["measured_mean_s"]
            fig[f"predicted_speedup_over_{base}"] = out[base]["predicted_mean_s"] / fig["predicted_mean_s"]
    return out


def table(record: dict[str, Any]) -> str:
    """The markdown report of a record (see the module docstring)."""
    s = record["settings"]
    figures = summarise(record)
    lines = [
        f"# Measured step times: static, Megatron-Core's scheduler, dhp under Megatron's rules, dhp "
        f"({s['procs']} processes)",
        "",
        f"`trainer.train_hf` under torchrun, gloo on CPU, {s['procs']} processes on {s['cores']} cores, "
        f"one thread each; Llama {s['layers']} x {s['hidden']} ({s['heads']} heads, {s['kv_heads']} key/value "
        f"heads, {s['dtype']}); {s['samples']} samples per step, lengths {s['shortest']}..{s['longest']} "
        f"(log-uniform, seed {s['seed']}), {s['capacity_tokens']} tokens per rank; {s['steps']} timed steps per "
        f"arm after {s['warmup']} warm-up steps. Measured: the slowest rank's step (forward, backward, barriers, "
        "gradient all-reduce, optimizer). Predicted: the plan's step time under the profile of its execution.",
        "",
        "| arm | execution | measured median (ms) | measured mean (ms) | predicted mean (ms) "
        "| predicted / measured - 1 | mean abs error: steps, groups | speedup over (a) (predicted) "
        "| speedup over (b) (predicted) | micro-batches |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in [a for a in ARM_ORDER if a in figures]:
        f = figures[arm]
        over = [
            f"{f[f'speedup_over_{b}']:.3f}x ({f[f'predicted_speedup_over_{b}']:.3f}x)"
            if f"speedup_over_{b}" in f
            else "-"
            for b in ("static", "megatron")
        ]
        execution = record["timing"][arm].get("execution", "")
        group = "-" if f["mean_abs_group_error"] is None else f"{f['mean_abs_group_error'] * 100:.1f}%"
        lines.append(
            f"| {LABELS[arm]} | {execution} | {f['measured_median_s'] * 1e3:.1f} | "
            f"{f['measured_mean_s'] * 1e3:.1f} | {f['predicted_mean_s'] * 1e3:.1f} | "
            f"{f['error_of_means'] * 100:+.1f}% | {f['mean_abs_step_error'] * 100:.1f}%, {group} | "
            f"{over[0]} | {over[1]} | {f['micro_batches_mean']:.1f} |"
        )
    sample = record["sample_profile"]
    fitted = record.get("profile_report") or {}
    rings = (
        f"; rings R^2 {fitted['ring_r2']:.4f}, largest relative error {fitted['ring_max_rel_error']:.3f}, "
        f"{fitted['latency_s'] * 1e6:.0f} us per message"
        if "ring_r2" in fitted
        else ""
    )
    lines += [
        "",
        f"Profile: {record.get('profile_source', '')}{rings}.",
        "",
        "Per-sample profile (arms b, c; `trainer.per_sample_costs`): sample_constant a0 + b = "
        f"{sample['time']['sample_constant'] * 1e3:.3f} ms, group_constant = the barrier "
        f"{record['barrier_s'] * 1e3:.3f} ms, messages per sample {sample['comm']['messages_per_step']:g} per "
        f"ring step + {sample['comm'].get('messages_fixed', 0):g}, step constant "
        f"{sample['time'].get('step_constant', 0) * 1e3:.3f} ms (one barrier fewer than barrier groups).",
    ]
    unverified = [a for a, f in figures.items() if not f["verified"]]
    if unverified:
        lines += [
            "",
            f"Plans not valid under their execution's rules (run as planned, see e2e.json): {', '.join(unverified)}.",
        ]
    check = record.get("check")
    if check:
        n = check["steps"]
        lines += [
            "",
            f"## Loss check: {check['procs']} processes, {check['dtype']}, {n} steps",
            "",
            "| arm | "
            + " | ".join(f"step {k} loss" for k in range(n))
            + " | largest relative difference to one process |",
            "|---|" + "---|" * n + "---|",
        ]
        for arm in [a for a in ARM_ORDER if a in check["losses"]]:
            ref = check["max_rel_diff_to_one_process"].get(arm)
            losses = " | ".join(f"{v:.12f}" for v in check["losses"][arm][:n])
            lines.append(f"| {LABELS[arm]} | {losses} | {'-' if ref is None else f'{ref:.2e}'} |")
        verdict = "equal" if check["equal"] else "NOT equal"
        lines += [
            "",
            "Largest relative difference between arms at the same step: "
            f"{check['max_rel_diff_between_arms']:.2e} (tolerance {check['tolerance']:g}: {verdict}).",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report = None
    if args.profile:
        profile = Path(args.profile).resolve()
    else:
        profile, report = fit_profile(args, out_dir)
    from trainer.per_sample_costs import measure_barrier, per_sample_profile

    barrier_s = args.barrier_s
    if barrier_s is None:
        barrier_s = measure_barrier(args.procs)
        log(f"barrier over {args.procs} processes: {barrier_s * 1e6:.1f} us")
    packed = json.loads(profile.read_text())
    packed["capacity_tokens_per_rank"] = args.capacity_tokens
    names = (
        "procs",
        "steps",
        "warmup",
        "samples",
        "shortest",
        "longest",
        "capacity_tokens",
        "seed",
        "hidden",
        "layers",
        "heads",
        "kv_heads",
        "budget_ms",
    )
    settings = {k: getattr(args, k) for k in names}
    settings.update(cores=os.cpu_count(), dtype="float32", arms=args.arm_list)
    record: dict[str, Any] = {
        "settings": settings,
        "profile": packed,
        "profile_source": packed.get("source", str(profile)),
        "profile_report": report,
        "barrier_s": barrier_s,
        "sample_profile": per_sample_profile(packed, barrier_s),
        "timing": {},
        "check": None,
    }
    arms = args.arm_list
    for k, arm in enumerate(arms):
        log(f"[{k + 1}/{len(arms)}] timing {LABELS[arm]} on {args.procs} processes, {args.warmup} + {args.steps} steps")
        run = train(
            arm, args.procs, args.warmup + args.steps, "float32", args, profile, barrier_s, out_dir / f"time_{arm}.json"
        )
        run["steps"] = run["steps"][args.warmup :]
        record["timing"][arm] = run
    if args.check_procs:
        runs = {}
        for k, arm in enumerate(arms):
            log(
                f"[{k + 1}/{len(arms)}] loss check of {LABELS[arm]} on {args.check_procs} processes, {args.check_dtype}"
            )
            runs[arm] = train(
                arm,
                args.check_procs,
                args.check_steps,
                args.check_dtype,
                args,
                profile,
                barrier_s,
                out_dir / f"check_{arm}.json",
                reference=True,
            )
        kept = {a: {"steps": r["steps"], "max_parameter_diff": r.get("max_parameter_diff")} for a, r in runs.items()}
        record["check"] = {"procs": args.check_procs, **loss_check(runs, args.check_dtype), "runs": kept}
    record["wall_s"] = time.perf_counter() - started
    (out_dir / "e2e.json").write_text(json.dumps(record, indent=1) + "\n")
    text = table(record)
    (out_dir / "e2e.md").write_text(text)
    print(text)
    log(f"wrote {out_dir / 'e2e.json'} and {out_dir / 'e2e.md'} in {record['wall_s']:.0f} s")
    return 0 if record["check"] is None or record["check"]["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
