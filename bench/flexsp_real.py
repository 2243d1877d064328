"""The real FlexSP solver (Hetu-Galvatron's ``flexsp_solver``) as a benchmark baseline, under our profile.

FlexSP's code is not part of this project: it is imported at run time from a folder
(``--flexsp-src``, by default ``../shared/peers/flexsp`` beside the repository when present) and
run in a child process (:mod:`bench.flexsp_worker`), so its process pools and its SCIP solves
never share the benchmark's process. It needs ``pyscipopt`` (``pip install 'dhp-planner[flexsp]'``).

Same cost model. FlexSP's ``flexSPCostModel`` is built from our :class:`~optimizer.costs.profile.CostProfile`
so that its group time equals ours for every group it may form (:func:`translation`):

- ``cpt_alpha1 = quadratic * 1e3``, ``cpt_alpha2 = linear * 1e3``, ``cpt_beta1 = group_constant * 1e3``
  (its times are in ms, once per group per micro-batch like our group constant);
- its all-to-all time is ``4*2*l*h*L*2 / 2^20 / sp`` MB over a bandwidth table in GB/s, which is
  ``16 l h L / 2^20 / sp / v`` ms; ours is ``k L / sp / bw`` s. For every power of two ``sp`` from
  2 to the domain the table gets ``v = 16 l h bw(sp) / (2^20 * 1e3 * k)`` with ``bw(sp)`` our intra-node
  bandwidth where ``sp`` fits a node and our inter-node one above (``l``, ``h``: the model's layers
  and hidden size; any values give the same times);
- its token capacity ``int((memory_gb * 1024 - states_mb) / act_per_token)`` becomes ours with
  ``param_size_B = 0`` (no model states), ``act_per_token = 1024`` and ``memory_limit_gb = C``.

Profiles FlexSP's model cannot express are skipped with the reason recorded, never approximated:
ring profiles (its communication model is Ulysses all-to-all), a per-sample constant, vision-encoder
terms on a batch with images, per-message latency, overlap of communication with attention, and
mixed GPU speeds or capacities.

What it runs is what its own script runs (``solver.py --method_type flexSP``):
``flexSPOptimizer(...).solve_flexSP_globalbatch_mp_gbmb(seqs, chunk_alg="sort_consec", bucket_alg="dp",
mb_option_num=5, bucket_num=16)`` with SCIP's ``limits/time`` per MILP (its scripts use 10 s). It
opens one process per micro-batch count and a pool per count; here those run one count at a time,
each pool capped at ``workers`` processes, so at most ``workers`` SCIP solves run at once. (The
process that waits on a pool polls it in a loop, as FlexSP's code does, which keeps one more core
busy; SCIP's time limit is wall-clock time, so on a machine with few cores its MILPs get less
search within the same limit than on a large one.)

Its answer is a list of groups per micro-batch, each with a size and its sequences. The groups are
laid out on ranks here, largest first on contiguous ranges (so every power-of-two group is aligned
to its size and one of size <= the node size stays inside a node), its sequence ids are our sample
indices, and the resulting :class:`~optimizer.plan.records.Assignment` is verified and scored by the
benchmark runner like every other planner's. FlexSP places no limit on its group sizes from the
attention heads; the benchmark's model has as many heads as the domain has ranks, so every size
FlexSP may choose is a valid Ulysses size for us too.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optimizer.costs.tables import CostTables
from optimizer.errors import ProblemError
from optimizer.plan.records import Assignment

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SRC = REPO_ROOT.parent / "shared" / "peers" / "flexsp"
SOLVER_DIR = Path("galvatron") / "flexsp_solver"


@dataclass(frozen=True)
class FlexSPSettings:
    """How the real FlexSP solver runs in the benchmark."""

    src: str | None = None
    """Folder holding ``galvatron/flexsp_solver``; None: :data:`DEFAULT_SRC`."""
    time_limit_s: float = 10.0
    """SCIP ``limits/time`` of each MILP (its scripts use 10 s)."""
    workers: int = 2
    """Most processes its pools start (and SCIP solves at once)."""
    mb_option_num: int = 5
    bucket_num: int = 16
    reuse: str | None = None
    """An earlier ``dhp bench --suite flexsp`` run's results.json (``--flexsp-from``): FlexSP's record of each batch
    is taken from it instead of running the solver. Its answers do not depend on dhp's planner, and that run
    verified and scored them under the same profiles; a run of FlexSP's whole grid takes hours."""
    timeout_s: float = 7200.0
    """Wall-clock limit of one whole solve; the child processes are ended past it."""
    cache: str | None = None
    """Folder of finished solves, keyed by everything FlexSP is given (``--flexsp-cache``): a solve
    found there is not run again. FlexSP's answers do not depend on this project's planner, so a
    benchmark re-run after a planner change reuses them."""

    def __post_init__(self) -> None:
        if not 0 < self.time_limit_s <= 3600:
            raise ProblemError(
                f"must be from 0 to 3600 s, got {self.time_limit_s}",
                field="--flexsp-time-limit",
                hint="e.g. --flexsp-time-limit 10 (its scripts' value).",
            )
        if not 1 <= self.workers <= 256:
            raise ProblemError(
                f"must be from 1 to 256, got {self.workers}", field="--flexsp-workers", hint="e.g. --flexsp-workers 2."
            )

    @property
    def source(self) -> Path:
        return Path(self.src).expanduser().resolve() if self.src else DEFAULT_SRC

    def to_json(self) -> dict[str, Any]:
        return {
            "src": str(self.source),
            "time_limit_s": self.time_limit_s,
            "workers": self.workers,
            "mb_option_num": self.mb_option_num,
            "bucket_num": self.bucket_num,
            "timeout_s": self.timeout_s,
            "cache": self.cache,
            "reuse": self.reuse,
        }


def missing(settings: FlexSPSettings) -> str | None:
    """Why the real FlexSP solver cannot run here (None when it can)."""
    src = settings.source
    if not (src / SOLVER_DIR / "solver.py").is_file():
        return (
            f"FlexSP's source is not at {src} (no {SOLVER_DIR / 'solver.py'}): give --flexsp-src PATH, "
            "the folder holding galvatron/flexsp_solver (Hetu-Galvatron, branch flexsp)"
        )
    if importlib.util.find_spec("pyscipopt") is None:
        return "pyscipopt (SCIP) is not installed, FlexSP's solver needs it: pip install 'dhp-planner[flexsp]'"
    return None


@functools.lru_cache(maxsize=4)
def stored_records(settings: FlexSPSettings) -> dict[tuple[str, str, int, int, int], dict[str, Any]]:
    """FlexSP's records in the run ``settings.reuse`` names, by batch (profile, workload, ranks, samples, seed);
    a ProblemError naming the flag when the file cannot be read or FlexSP ran there with other settings. Read once
    per settings: every cell of a grid asks for it."""
    path = Path(settings.reuse or "")
    hint = "give the results.json of an earlier `dhp bench --suite flexsp` run."
    try:
        doc = json.loads(path.read_text())
        stored = doc["spec"]["flexsp"]
        records = doc["records"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        why = f"cannot read FlexSP's answers from {path}: {exc}"
        raise ProblemError(why, field="--flexsp-from", hint=hint) from exc
    for key in ("time_limit_s", "mb_option_num", "bucket_num"):
        if stored.get(key) != getattr(settings, key):
            fix = f"--flexsp-time-limit {stored.get(key)}, as that run" if key == "time_limit_s" else "a run of these"
            raise ProblemError(
                f"{path} ran FlexSP with {key} {stored.get(key)}, this run with {getattr(settings, key)}",
                field="--flexsp-from",
                hint=f"give {fix} (its settings are in that file's spec.flexsp).",
            )
    return {
        (r.get("profile", "analytical"), r["workload"], r["ranks"], r["samples"], r["seed"]): r
        for r in records
        if r.get("planner") == "flexsp"
    }


def require(settings: FlexSPSettings) -> None:
    """Raise a ProblemError naming the flag to fix when FlexSP cannot run (or, with ``reuse``, its answers cannot be
    read)."""
    if settings.reuse is not None:
        stored_records(settings)
        return
    why = missing(settings)
    if why is not None:
        field = "--flexsp-src" if "source" in why else "pyscipopt"
        raise ProblemError(why, field=field, hint="install it or leave the flexsp planner out of --planners.")


def import_flexsp(src: str | Path) -> Any:
    """FlexSP's ``solver`` module from the folder ``src`` (its C++ extension replaced by its own Python twin)."""
    root = Path(src).resolve()
    for p in (root / SOLVER_DIR, root):
        if str(p) not in sys.path:
            sys.path.insert(0, str(p))
    sys.modules.setdefault("sequence_module", importlib.import_module("sequence_module_py"))
    return importlib.import_module("galvatron.flexsp_solver.solver")


# -- the cost model ------------------------------------------------------------------------------


def _pow2_sizes(n_ranks: int) -> list[int]:
    return [1 << k for k in range(1, n_ranks.bit_length()) if (1 << k) <= n_ranks]


def translation(tables: CostTables) -> tuple[dict[str, Any] | None, str | None]:
    """(FlexSP's cost-model and optimizer arguments equal to our profile, None) or (None, why
    it cannot be expressed)."""
    p = tables.profile
    problem = tables.problem
    n = tables.n_ranks
    if p.scheme != "ulysses":
        return None, f"{p.scheme} profile: FlexSP's communication model is Ulysses all-to-all; not translated"
    if p.sample_constant > 0:
        return None, "the profile has a per-sample constant (time.sample_constant), which FlexSP's cost model lacks"
    if (p.vision_linear or p.vision_quadratic) and float(tables.vision.max(initial=0.0)) > 0:
        return (
            None,
            "the profile has vision-encoder terms and the batch has images; FlexSP's cost model has no such term",
        )
    if p.messages_per_step * max(p.intra_latency, p.inter_latency) > 0:
        return None, "the profile has per-message latency, which FlexSP's cost model lacks"
    if p.overlap_with_attention:
        return None, "the profile overlaps communication with attention, which FlexSP's cost model lacks"
    if not tables.homogeneous:
        return None, "mixed GPU speeds or capacities: FlexSP's cost model is for one GPU type"
    node = tables.node_size
    if any(b - a != node for a, b in tables.node_ranges) or node & (node - 1):
        return (
            None,
            "nodes of different sizes, or not a power of two: FlexSP's intra/inter split by group size does not apply",
        )
    sizes = _pow2_sizes(n)
    allowed = set(tables.degrees.tolist())
    lacking = [s for s in sizes if s not in allowed]
    if lacking:
        return None, (
            f"FlexSP may choose group sizes {lacking}, which this problem does not allow (Ulysses heads, max_degree, "
            f"degree policy); give the model heads divisible by {n} and options.max_degree {n}"
        )
    cap = float(tables.rank_capacity[0])
    if cap != int(cap):
        return None, f"capacity {cap} tokens per rank is not a whole number; FlexSP's capacity is"
    if int(tables.lengths.max()) > cap * n:
        return (
            None,
            f"the longest sample ({int(tables.lengths.max())} tokens) exceeds the domain's capacity ({int(cap)} x {n})",
        )
    llm = problem.model.llm
    layers, hidden = int(llm.layers), int(llm.hidden)
    table: dict[int, float] = {1: 1e10}
    for s in sizes:
        bw = p.bandwidth(s, s <= node)
        table[s] = (
            math.inf if p.bytes_per_token == 0 else 16.0 * layers * hidden * bw / (2**20 * 1e3 * p.bytes_per_token)
        )
    cost = {
        "cluster_size": n,
        "hidden_size": hidden,
        "layer_num": layers,
        "param_size_B": 0.0,
        "zero_stage": 3,
        "mixed_precision": True,
        "act_per_token": 1024.0,
        "cpt_alpha1": p.quadratic * 1e3,
        "cpt_alpha2": p.linear * 1e3,
        "cpt_beta1": p.group_constant * 1e3,
        "alltoall_bandwidth_dict_gbs": table,
    }
    return {"cost_model": cost, "memory_limit_gb": int(cap), "cluster_size": n}, None


def build_optimizer(module: Any, params: dict[str, Any], time_limit_s: float) -> Any:
    """FlexSP's ``flexSPOptimizer`` over a ``flexSPCostModel`` built from :func:`translation`'s arguments."""
    cost = dict(params["cost_model"])
    cost["alltoall_bandwidth_dict_gbs"] = {int(k): float(v) for k, v in cost["alltoall_bandwidth_dict_gbs"].items()}
    model = module.flexSPCostModel(**cost)
    return module.flexSPOptimizer(
        cluster_size=int(params["cluster_size"]),
        memory_limit_gb=int(params["memory_limit_gb"]),
        costmodel=model,
        hide_scipoutput=True,
        hide_alloutput=True,
        concurrent=False,
        scip_param_dict={"limits/time": float(time_limit_s)},
        strategy="flexSP",
    )


# -- running it -----------------------------------------------------------------------------------


@dataclass
class FlexSPRun:
    """FlexSP's answer, laid out on ranks, and what it took."""

    assignment: Assignment | None
    note: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def layout(micro_batches: list[list[tuple[int, list[int]]]], n_ranks: int) -> Assignment:
    """Groups (size, sample indices) per micro-batch on ranks: largest first, contiguous from rank 0."""
    out: list[list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]]] = []
    for mb in micro_batches:
        at = 0
        groups: list[tuple[list[int] | tuple[int, ...], list[int] | tuple[int, ...]]] = []
        for size, samples in sorted(mb, key=lambda g: -int(g[0])):
            if at + int(size) > n_ranks:
                raise ValueError(f"FlexSP's groups of one micro-batch need more than {n_ranks} ranks")
            groups.append((tuple(range(at, at + int(size))), tuple(int(i) for i in samples)))
            at += int(size)
        out.append(groups)
    return Assignment.of(out)


def solve(tables: CostTables, settings: FlexSPSettings, seed: int = 0) -> FlexSPRun:
    """Run FlexSP on the batch of ``tables`` under the same profile; the plan is not verified here (the runner does)."""
    params, why = translation(tables)
    if params is None:
        return FlexSPRun(None, f"skipped: {why}", {"skipped": True})
    why = missing(settings)
    if why is not None:
        return FlexSPRun(None, f"skipped: {why}", {"skipped": True})
    job = {
        "src": str(settings.source),
        "params": params,
        "lengths": [int(x) for x in tables.lengths.tolist()],
        "time_limit_s": settings.time_limit_s,
        "workers": settings.workers,
        "mb_option_num": settings.mb_option_num,
        "bucket_num": settings.bucket_num,
        "seed": seed,
    }
    cached = _cache_path(settings, job)
    if cached is not None and cached.is_file():
        result = json.loads(cached.read_text())
        return _run_of(result, tables, settings, {"cached": str(cached)})
    with tempfile.TemporaryDirectory(prefix="dhp-flexsp-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))  # an infinite bandwidth (no communication) travels as Infinity
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.flexsp_worker", str(job_path), str(out_path)],
            env=env,
            cwd=str(REPO_ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            _, err = proc.communicate(timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return FlexSPRun(
                None,
                f"FlexSP did not finish within {settings.timeout_s:.0f} s",
                {"process_wall_s": time.perf_counter() - start},
            )
        process_wall = time.perf_counter() - start
        if proc.returncode != 0 or not out_path.is_file():
            tail = (err or "").strip().splitlines()[-3:]
            return FlexSPRun(
                None,
                f"FlexSP's process failed (exit {proc.returncode}): {' / '.join(tail)}",
                {"process_wall_s": process_wall},
            )
        result = json.loads(out_path.read_text())
    result["process_wall_s"] = process_wall
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = cached.with_suffix(".tmp")
        tmp_path.write_text(json.dumps(result))
        tmp_path.replace(cached)
    return _run_of(result, tables, settings, {})


def _cache_path(settings: FlexSPSettings, job: dict[str, Any]) -> Path | None:
    """Where the answer to ``job`` is kept (None without a cache folder): a hash of the job, FlexSP's
    source folder left out."""
    if not settings.cache:
        return None
    import hashlib

    key = {k: v for k, v in job.items() if k not in ("src", "workers")}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return Path(settings.cache).expanduser() / f"flexsp-{digest}.json"


def _run_of(result: dict[str, Any], tables: CostTables, settings: FlexSPSettings, extra: dict[str, Any]) -> FlexSPRun:
    details = {
        "solve_wall_s": result["solve_wall_s"],
        "process_wall_s": result.get("process_wall_s"),
        "micro_batches": len(result["micro_batches"]),
        "flexsp_predicted_step_time_s": result["flexsp_step_ms"] / 1e3,
        "settings": settings.to_json(),
        **extra,
    }
    if not result["micro_batches"]:
        return FlexSPRun(None, "FlexSP found no feasible plan for any micro-batch count it tried", details)
    return FlexSPRun(layout(result["micro_batches"], tables.n_ranks), None, details)
