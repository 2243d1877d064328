"""dhp as Megatron-Core's hybrid context-parallel scheduler (``pip install 'dhp-planner[megatron]'``).

Megatron-Core (0.16.1) runs hybrid context parallelism from a schedule: its data-loader wrapper
(``megatron.core.datasets.data_schedule.HybridCPDataLoaderWrapper``) gathers the sub-sample lengths
of the global batch and asks its scheduler (``BalancedCPScheduler``) for
``get_groups_and_subsamples(sample_id_seqlens, config) -> (groups, sample_id_groups)``, where
``sample_id_groups[k][r]`` lists the sample ids rank r of the data x context-parallel domain runs in
barrier group k and ``groups[k][r]`` their lengths. A sample's context-parallel size is the number
of ranks listing it, and its process group is the one of that size Megatron created at start that
holds the rank: an aligned block of a power of two from 2 below the domain's largest power of two,
the whole domain, or the rank alone. Each rank runs its sub-samples one after another, one forward
and backward each, with a barrier between barrier groups; the last sub-sample of the last group
runs outside ``no_sync`` and triggers the gradient reduction, so every rank needs one there.

:class:`PlannedCPScheduler` takes the same constructor arguments and answers the same call with a
plan of the planner, made under those rules (:data:`MEGATRON_RULES`: ``degree_policy`` ``aligned``,
``memory`` ``sample``) and the cost profile of the job: ``time.sample_constant`` is what each
sub-sample pays alone (its own forward and backward), ``time.group_constant`` what each barrier
group pays, the rest as for any plan (:mod:`optimizer.costs.profile`). Three lines in a training
script swap it in::

    from trainer.megatron import install
    wrapper = HybridCPDataLoaderWrapper(train_data_iterator, config)
    install(wrapper, profile="profile.json", model="qwen2-vl-7b", gpus_per_node=8, tensor_parallel=tp_size)

With ``torch.distributed`` initialised and a real process group, rank 0 of the group plans and
broadcasts the schedule, and every rank checks the digest of what it runs (with
``deterministic=True`` every rank plans the same plan itself; the digest is still checked). Without
it (one process, tests) it plans locally and works with any group object that has ``size()``, as
Megatron's own scheduler does. ``url`` plans through the planning service with the client;
:meth:`PlannedCPScheduler.plan_ahead` submits the next batch early (to the service, or to a planning
thread in process) so its plan is made while the current step trains.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optimizer.costs.tables import CostTables
from optimizer.errors import ProblemError
from optimizer.gc_pause import collector_paused
from optimizer.plan.records import Assignment, GroupAssignment
from optimizer.problem.batch import MAX_TOKENS, Batch, Sample
from optimizer.problem.problem import Problem

MEGATRON_RULES: dict[str, Any] = {"degree_policy": "aligned", "memory": "sample"}
"""The planner options that say how Megatron-Core runs a schedule (see the module docstring)."""
DEFAULT_GPUS_PER_NODE = 8
SCHEDULE_FIXED_MS = 4.0
SCHEDULE_MS_PER_SAMPLE = 0.004
"""What turning a plan into a schedule costs beside the planner (see :func:`schedule_reserve_ms`)."""
"""GPUs per node when the caller does not say (the usual HGX / DGX node)."""

SCHEDULER_MODULE = "megatron.core.pipeline_parallel.hybrid_cp_schedule"
"""Where megatron-core keeps ``BalancedCPScheduler``."""
INSTALL_HINT = "pip install 'dhp-planner[megatron]' (megatron-core and torch)"

SampleSeqlens = Sequence[tuple[Any, int]]
Schedule = tuple[list[list[list[int]]], list[list[list[Any]]]]
"""(groups, sample_id_groups) as Megatron-Core's scheduler returns them."""


@dataclass(frozen=True)
class DomainGroup:
    """What Megatron's schedulers read of the data x context-parallel process group, its size: a
    stand-in for the group where there is no job (benchmarks, the trainer's rank 0 planning ahead)."""

    ranks: int

    def size(self) -> int:
        return self.ranks


def balanced_scheduler_class() -> Any:
    """megatron-core's own ``BalancedCPScheduler`` class; ImportError naming the install when it cannot be imported."""
    import importlib
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its optimizer modules warn that Transformer Engine and Apex are absent
            module = importlib.import_module(SCHEDULER_MODULE)
    except ImportError as exc:
        raise ImportError(
            f"megatron-core's scheduler cannot be imported ({type(exc).__name__}: {exc}); {INSTALL_HINT}"
        ) from exc
    return module.BalancedCPScheduler


# -- plans and schedules ----------------------------------------------------------------------


def schedule_of(assignment: Assignment, ids: Sequence[Any], lengths: Sequence[int], n_ranks: int) -> Schedule:
    """Megatron's (groups, sample_id_groups) of an assignment: per barrier group (a micro-batch), per
    rank, the lengths and ids (``ids[i]`` of sample index i) of the samples its group runs, in order."""
    groups: list[list[list[int]]] = []
    sample_ids: list[list[list[Any]]] = []
    for mb in assignment.micro_batches:
        seqlens: list[list[int]] = [[] for _ in range(n_ranks)]
        members: list[list[Any]] = [[] for _ in range(n_ranks)]
        for ranks, samples in mb:
            those = [ids[i] for i in samples]
            their = [int(lengths[i]) for i in samples]
            for r in ranks:
                members[r] = list(those)
                seqlens[r] = list(their)
        groups.append(seqlens)
        sample_ids.append(members)
    return groups, sample_ids


def assignment_of(sample_id_groups: Sequence[Sequence[Sequence[Any]]], index: Mapping[Any, int]) -> Assignment:
    """The assignment a Megatron schedule stands for: in each barrier group, a sample's group is the
    ranks that list it (in rank order); ``index`` maps a sample id to its index in the batch. Ranks
    listing samples of different groups come out as overlapping groups, which the verifier refuses."""
    mbs: list[list[tuple[tuple[int, ...], list[int]]]] = []
    for per_rank in sample_id_groups:
        where: dict[int, list[int]] = {}
        for r, listed in enumerate(per_rank):
            for sid in listed:
                where.setdefault(index[sid], []).append(r)
        by_ranks: dict[tuple[int, ...], list[int]] = {}
        for i, ranks in where.items():
            by_ranks.setdefault(tuple(ranks), []).append(i)
        mbs.append(list(by_ranks.items()))
    return Assignment.of(mbs)  # type: ignore[arg-type]


def busy_last(problem: Problem, assignment: Assignment) -> Assignment:
    """The assignment with a barrier group in which every rank has a sample as its last one.

    Megatron runs the last sub-sample of the last barrier group outside ``no_sync`` on every rank,
    so a rank without one there fails. Barrier groups can run in any order, so one where every rank
    is busy goes last. When none is, the barrier group with the fewest idle ranks goes last and its
    idle ranks get work: each idle aligned block takes one sample that fits it alone from a group
    holding two or more (the one that leaves the barrier group fastest); ranks still idle then, as in
    Megatron's own scheduler, go to the smallest groups, each doubled in turn."""
    n = problem.cluster.domain_size
    mbs = list(assignment.micro_batches)
    idle = [n - sum(len(r) for r, _ in mb) for mb in mbs]
    last = min(range(len(mbs)), key=lambda m: (idle[m], -m))
    if idle[last]:
        mbs[last] = _fill_idle(CostTables.build(problem), mbs[last])
    if last != len(mbs) - 1:
        mbs.append(mbs.pop(last))
    return Assignment(tuple(mbs))


def _idle_blocks(used: set[int], n: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The idle ranks as maximal aligned blocks (start, size) of the allowed ``sizes``, largest first."""
    blocks: list[tuple[int, int]] = []
    r = 0
    while r < n:
        if r in used:
            r += 1
            continue
        size = 1
        for d in sorted(sizes, reverse=True):
            if d < n and r % d == 0 and r + d <= n and not used.intersection(range(r, r + d)):
                size = d
                break
        blocks.append((r, size))
        r += size
    return sorted(blocks, key=lambda b: (-b[1], b[0]))


def _fill_idle(tables: CostTables, mb: tuple[GroupAssignment, ...]) -> tuple[GroupAssignment, ...]:
    """``mb`` with every rank in a group that has a sample (see :func:`busy_last`)."""
    groups = [(tuple(r), list(s)) for r, s in mb]
    n = tables.n_ranks
    sizes = [int(d) for d in tables.degrees]
    fit = tables.sample_capacity.min()
    for start, size in _idle_blocks({r for ranks, _ in groups for r in ranks}, n, sizes):
        block = tuple(range(start, start + size))
        best: tuple[float, int, int] | None = None
        for g, (ranks, samples) in enumerate(groups):
            if len(samples) < 2:
                continue
            for k, i in enumerate(samples):
                if tables.lengths[i] > fit * size:
                    continue
                rest = samples[:k] + samples[k + 1 :]
                worst = max(tables.group_time(rest, ranks), tables.group_time([i], block))
                if best is None or worst < best[0]:
                    best = (worst, g, k)
        if best is not None:
            _, g, k = best
            groups.append((block, [groups[g][1].pop(k)]))
    idle = n - sum(len(r) for r, _ in groups)
    if not idle:
        return tuple((r, tuple(s)) for r, s in sorted(groups, key=lambda g: min(g[0])))
    # No sample left to move: the smallest groups grow (the slowest first) until the ranks add up,
    # then the barrier group is laid out on aligned blocks again, largest first.
    widths = [len(r) for r, _ in groups]
    while idle > 0:
        least = min(widths)
        g = max(
            (k for k, w in enumerate(widths) if w == least), key=lambda k: tables.group_time(groups[k][1], groups[k][0])
        )
        if 2 * least not in sizes or least > idle:
            raise ProblemError(
                f"{idle} ranks have no sample in any barrier group and no group can grow onto them",
                field="batch",
                hint="give the batch at least as many samples as the data x context-parallel domain has ranks.",
            )
        widths[g] *= 2
        idle -= least
    out: list[GroupAssignment] = []
    start = 0
    for k in sorted(range(len(groups)), key=lambda k: -widths[k]):
        out.append((tuple(range(start, start + widths[k])), tuple(groups[k][1])))
        start += widths[k]
    return tuple(out)


def schedule_digest(schedule: Schedule) -> str:
    """SHA-256 of a schedule's sample ids per barrier group and rank (what every rank must run alike;
    the lengths are the ids')."""
    return hashlib.sha256(repr(schedule[1]).encode()).hexdigest()


# -- the scheduler ----------------------------------------------------------------------------


class PlannedCPScheduler:
    """Megatron-Core's ``BalancedCPScheduler`` interface, planned by dhp (see the module docstring).

    ``max_seq_len_per_rank``: tokens of one sub-sample a rank holds (the profile's capacity);
    ``dp_cp_group``: the data x context-parallel group, or any object with ``size()``. Keywords:
    ``profile`` (a profile document or its file, as ``dhp plan --profile`` takes; default the
    analytical profile of ``model`` on the cluster), ``model`` (a model document or preset name),
    ``gpus_per_node`` and ``tensor_parallel`` (the nodes the domain's ranks live on, in Megatron's
    rank order), ``cluster`` (a whole cluster document instead), ``budget_ms`` (the planning budget
    of a batch), ``url`` (the planning service; None plans in process), ``deterministic``, ``token``
    (the service's bearer token). ``last`` holds what the last call planned (the plan, its predicted
    step time under Megatron's rules, where it came from and how long it took).
    """

    def __init__(
        self,
        max_seq_len_per_rank: int,
        dp_cp_group: Any,
        *,
        profile: Mapping[str, Any] | str | Path | None = None,
        model: Mapping[str, Any] | str | None = None,
        gpus_per_node: int | None = None,
        tensor_parallel: int = 1,
        cluster: Mapping[str, Any] | None = None,
        budget_ms: float = 200.0,
        url: str | None = None,
        deterministic: bool = False,
        token: str | None = None,
    ) -> None:
        self.max_seq_len_per_rank = int(max_seq_len_per_rank)
        self.dp_cp_group = dp_cp_group
        self.total_hdp_gpus = int(dp_cp_group.size())
        if self.max_seq_len_per_rank < 1:
            raise ProblemError(
                f"must be a positive number of tokens, got {max_seq_len_per_rank!r}",
                field="max_seq_len_per_rank",
                hint="give the tokens of one sub-sample a rank holds (Megatron's max_seqlen_per_dp_cp_rank).",
            )
        self.budget_ms = float(budget_ms)
        self.deterministic = bool(deterministic)
        self._cluster = (
            dict(cluster) if cluster is not None else _cluster_doc(self.total_hdp_gpus, gpus_per_node, tensor_parallel)
        )
        given = _read_profile(profile)
        self._model = _model_doc(model, given)
        self._profile = self._profile_doc(given)
        self._client: Any = None
        if url is not None:
            from api.client.planner_client import PlannerClient

            self._client = PlannerClient(url, token=token, local_fallback=True)
        self._ahead: dict[str, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.last: dict[str, Any] = {}
        self._template: Problem | None = None
        if self._plans_here():
            # The planner's compiled kernels load now, not in the first batch's budget (planning.warm).
            from planning.planner import warm_up
            from solver_models import builtin_backends

            warm_up()
            builtin_backends()

    # -- requests ------------------------------------------------------------------------------
    def _profile_doc(self, profile: dict[str, Any] | None) -> dict[str, Any]:
        """The profile in force, at Megatron's capacity: the given one, else the analytical profile of
        the model on the cluster (ring attention, as Megatron-Core's context parallelism runs it)."""
        if profile is None:
            from optimizer.costs.analytical import analytical_profile
            from optimizer.problem.documents import cluster_from_json, model_from_json

            profile = analytical_profile(
                model_from_json(self._model), cluster_from_json(self._cluster), "ring"
            ).to_json()
        profile["capacity_tokens_per_rank"] = self.max_seq_len_per_rank
        return profile

    def request(self, sample_id_seqlens: SampleSeqlens) -> dict[str, Any]:
        """The planning request of one global batch, as the service takes it (sample ids become strings)."""
        options = {**MEGATRON_RULES, "time_budget_ms": self.budget_ms, "deterministic": self.deterministic}
        samples = [{"id": str(sid), "text_tokens": int(length)} for sid, length in sample_id_seqlens]
        return {
            "batch": {"samples": samples},
            "cluster": self._cluster,
            "model": self._model,
            "profile": self._profile,
            "options": options,
        }

    def problem(self, sample_id_seqlens: SampleSeqlens) -> Problem:
        """The planning problem of one global batch: the job's cluster, model, profile and options
        (read once) with this batch (each length checked here, without the request document)."""
        if self._template is None:
            from optimizer.problem.documents import problem_from_json

            self._template = problem_from_json(self.request([("template", 1)]))
        samples = []
        for k, (sid, length) in enumerate(sample_id_seqlens):
            if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_TOKENS:
                raise ProblemError(
                    f"sample {sid!r} has length {length!r}",
                    field=f"sample_id_seqlens[{k}]",
                    hint="give each sub-sample as (id, length) with a positive integer length.",
                )
            samples.append(Sample.checked(str(sid), length, (), 0))
        return replace(self._template, batch=Batch(tuple(samples)))

    # -- planning ------------------------------------------------------------------------------
    def plan_ahead(self, sample_id_seqlens: SampleSeqlens) -> None:
        """Start planning a batch that comes later (on rank 0 of the group, or every rank when
        deterministic); :meth:`get_groups_and_subsamples` of the same batch then takes its plan."""
        if not self._plans_here():
            return
        key = _batch_key(sample_id_seqlens)
        if self._client is not None:
            self._ahead[key] = self._client.plan_ahead(self.request(sample_id_seqlens))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dhp-plan-ahead")
        self._ahead[key] = self._pool.submit(self._plan_in_process, list(sample_id_seqlens), time.perf_counter())

    def get_groups_and_subsamples(self, sample_id_seqlens: SampleSeqlens, config: Any = None) -> Schedule:
        """The schedule of one global batch, as Megatron-Core's scheduler returns it (``config`` is
        accepted for the same signature and not read)."""
        if not sample_id_seqlens:
            return [], []
        start = time.perf_counter()
        schedule: Schedule | None = None
        if self._plans_here():
            # A training process holds a large heap; a full collection inside the budget would cost
            # more than the plan (the planner pauses the collector the same way while it plans).
            with collector_paused():
                schedule = self._schedule(list(sample_id_seqlens), start)
        if _distributed(self.dp_cp_group) and not self.deterministic:
            schedule = _broadcast(schedule, self.dp_cp_group)
        assert schedule is not None
        if _distributed(self.dp_cp_group):  # one process has no other rank to agree with
            self.last["digest"] = schedule_digest(schedule)
            _check_digest(self.last["digest"], self.dp_cp_group)
        self.last["wall_ms"] = (time.perf_counter() - start) * 1000.0
        return schedule

    def _plans_here(self) -> bool:
        if self.deterministic or not _distributed(self.dp_cp_group):
            return True
        import torch.distributed as dist

        return bool(dist.get_rank(self.dp_cp_group) == 0)

    def _plan_in_process(self, sample_id_seqlens: SampleSeqlens, start: float) -> tuple[Problem, dict[str, Any]]:
        """The problem and the plan of a batch made here, due when its budget from ``start`` (a
        ``time.perf_counter()`` instant) less the schedule's own work (:func:`schedule_reserve_ms`) runs out."""
        from planning.deadline import Deadline
        from planning.planner import plan

        problem = self.problem(sample_id_seqlens)
        budget = max(self.budget_ms - schedule_reserve_ms(len(problem.batch.samples)), 1.0)
        return problem, plan(problem, deadline=Deadline.after_ms(budget, start)).to_json(shards=False)

    def _schedule(self, sample_id_seqlens: list[tuple[Any, int]], start: float) -> Schedule:
        from optimizer.verify.verifier import check_assignment

        pending = self._ahead.pop(_batch_key(sample_id_seqlens), None) if self._ahead else None
        source = "ahead" if pending is not None else "now"
        if isinstance(pending, Future):
            problem, doc = pending.result()
        elif self._client is not None:
            doc = (
                self._client.result(pending, wait_ms=60_000)
                if pending is not None
                else self._client.plan(self.request(sample_id_seqlens))
            )
            if doc.get("status") in ("pending", "failed", "error"):
                raise RuntimeError(
                    f"the planning service gave no plan for this batch: {doc.get('error') or doc.get('status')}"
                )
            problem = self.problem(sample_id_seqlens)
        else:
            problem, doc = self._plan_in_process(sample_id_seqlens, start)
        index = problem.batch.index
        assignment = Assignment(
            tuple(
                tuple((tuple(g["ranks"]), tuple(index[s] for s in g["samples"])) for g in mb["groups"])
                for mb in doc["micro_batches"]
            )
        )
        fixed = busy_last(problem, assignment)
        predicted = doc.get("predicted_step_time_s")
        if {g for mb in fixed.micro_batches for g in mb} != {g for mb in assignment.micro_batches for g in mb}:
            # The last barrier group was given work: verify what Megatron will run and say what it costs.
            report = check_assignment(problem, fixed)
            report.raise_if_failed()
            predicted = report.step_time_s
        self.last = {
            "plan": doc,
            "source": source,
            "predicted_step_time_s": predicted,
            "planned_step_time_s": doc.get("predicted_step_time_s"),
            "plan_ms": (time.perf_counter() - start) * 1000.0,
        }
        return schedule_of(fixed, [sid for sid, _ in sample_id_seqlens], problem.batch.lengths, self.total_hdp_gpus)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()


def install(wrapper: Any, **planner: Any) -> PlannedCPScheduler:
    """Swap a :class:`PlannedCPScheduler` into a ``HybridCPDataLoaderWrapper`` (keywords as for the
    scheduler; its capacity and group come from the wrapper) and return it."""
    scheduler = PlannedCPScheduler(wrapper.config.max_seqlen_per_dp_cp_rank, wrapper.dp_cp_group, **planner)
    wrapper.cp_balancing_scheduler = scheduler
    return scheduler


# -- helpers ----------------------------------------------------------------------------------


def schedule_reserve_ms(n_samples: int) -> float:
    """Milliseconds kept from a batch's budget for turning its plan into Megatron's schedule (reading
    the request, the last barrier group's check, the verification and the per-rank lists)."""
    return SCHEDULE_FIXED_MS + SCHEDULE_MS_PER_SAMPLE * n_samples


def _batch_key(sample_id_seqlens: SampleSeqlens) -> str:
    return hashlib.sha256(json.dumps([[str(s), int(n)] for s, n in sample_id_seqlens]).encode()).hexdigest()


def _cluster_doc(domain: int, gpus_per_node: int | None, tensor_parallel: int) -> dict[str, Any]:
    per_node = DEFAULT_GPUS_PER_NODE if gpus_per_node is None else int(gpus_per_node)
    tp = int(tensor_parallel)
    if per_node < 1 or tp < 1 or per_node % tp and tp % per_node:
        raise ProblemError(
            f"gpus_per_node {per_node} and tensor_parallel {tp} do not tile a node",
            field="gpus_per_node",
            hint="give the GPUs of one node and the job's tensor-parallel size (one divides the other).",
        )
    gpus = domain * tp
    if gpus < per_node:
        return {"nodes": 1, "gpus_per_node": gpus, "tensor_parallel": tp}
    if gpus % per_node:
        raise ProblemError(
            f"{domain} data x context-parallel ranks x tensor_parallel {tp} = {gpus} GPUs is not a whole number of "
            f"{per_node}-GPU nodes",
            field="gpus_per_node",
            hint="give the job's GPUs per node and tensor-parallel size.",
        )
    return {"nodes": gpus // per_node, "gpus_per_node": per_node, "tensor_parallel": tp}


def _read_profile(profile: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    """A copy of the profile document, read from its file when given a path (checked here, so that
    a bad profile is named when the scheduler is made, not at the first batch)."""
    if profile is None:
        return None
    from optimizer.problem.documents import profile_from_json, read_json_file

    doc = (
        dict(read_json_file(profile, "profile"))
        if isinstance(profile, (str, Path))
        else json.loads(json.dumps(profile))
    )
    profile_from_json(doc)
    return doc


def _model_doc(model: Mapping[str, Any] | str | None, profile: dict[str, Any] | None) -> dict[str, Any]:
    """The model document; without one a ring profile needs none (its times are the profile's) and
    the llama3-8b preset stands in, while the analytical profile and Ulysses (heads) need the model."""
    from optimizer.presets import load_preset

    if model is None:
        if profile is None or (profile.get("comm") or {}).get("scheme") == "ulysses":
            what = (
                "the analytical profile" if profile is None else "a Ulysses profile (group sizes must divide the heads)"
            )
            raise ProblemError(
                f"{what} needs the model",
                field="model",
                hint="pass model='llama3-8b' (a preset name) or a model document.",
            )
        return dict(load_preset("models", "llama3-8b", "model"))
    if isinstance(model, str):
        return dict(load_preset("models", model, "model"))
    return json.loads(json.dumps(model))


def _distributed(group: Any) -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized() and isinstance(group, dist.ProcessGroup))


def _broadcast(schedule: Schedule | None, group: Any) -> Schedule:
    import torch.distributed as dist

    box: list[Any] = [schedule]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    groups, sample_ids = box[0]
    return groups, sample_ids


def _check_digest(digest: str, group: Any) -> None:
    import torch.distributed as dist

    from trainer.plan_sync import PlanMismatch

    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, digest, group=group)
    if len(set(digests)) != 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise PlanMismatch(
            f"ranks of the data x context-parallel group hold different schedules: ranks {odd} differ from rank 0"
        )
