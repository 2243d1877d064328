"""Properties on random inputs: a valid problem gives a verified plan or a clear infeasibility error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.errors import InfeasibleError
from optimizer.problem.documents import problem_from_json
from optimizer.verify.verifier import verify
from planning.planner import plan

lengths = st.one_of(st.integers(1, 4000), st.integers(1, 4000), st.integers(4000, 40_000))


@st.composite
def requests(draw):
    n = draw(st.integers(1, 40))
    samples = []
    for i in range(n):
        doc = {"id": f"s{i}", "text_tokens": draw(lengths)}
        if draw(st.booleans()):
            doc["images"] = [{"tokens": draw(st.integers(1, 2000)), "frames": draw(st.integers(1, 8))}]
        samples.append(doc)
    # Domains of at least 4 ranks: a 7B model's states do not fit on fewer 80 GB GPUs.
    nodes = draw(st.integers(1, 4))
    per_node = draw(st.sampled_from([4, 6, 8]))
    options = {
        "backend": "heuristic",
        # Clock-free: whether a batch the heuristic cannot pack is rescued by the whole exact model in time
        # must not depend on how busy the machine is (a timed-out rescue is an honest "no plan in time").
        "deterministic": True,
        "degree_policy": draw(st.sampled_from(["any", "pow2"])),
        "max_micro_batches": draw(st.integers(1, 12)),
        "cp_scheme": draw(st.sampled_from(["ring", "ulysses"])),
    }
    if draw(st.booleans()):
        options["max_degree"] = draw(st.integers(1, nodes * per_node))
    return {
        "batch": {"samples": samples},
        "cluster": {"nodes": nodes, "gpus_per_node": per_node},
        "model_preset": draw(st.sampled_from(["internvl2-8b", "qwen2-vl-7b"])),
        "options": options,
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_valid_problem_gives_verified_plan_or_infeasible(doc):
    problem = problem_from_json(doc)
    try:
        result = plan(problem)
    except InfeasibleError as exc:
        assert exc.hint and exc.field
        return
    report = verify(result, problem)
    assert report.ok, report.violations
    assert result.lower_bound_s <= result.predicted_step_time_s * (1 + 1e-9)
    assert len(result.micro_batches) <= problem.options.max_micro_batches
    planned = sorted(s for mb in result.micro_batches for g in mb.groups for s in g.samples)
    assert planned == sorted(s.id for s in problem.batch.samples)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000))
def test_deterministic(seed):
    """In deterministic mode the same input gives the same plan, however loaded the machine (outside it, the
    heuristic's strategies stop at the budget, so a busy machine may get fewer of them done)."""
    from optimizer.problem.workloads import mixed

    doc = {
        "batch": mixed(48, seed=seed),
        "cluster": {"nodes": 2, "gpus_per_node": 8},
        "model_preset": "qwen2-vl-7b",
        "options": {"backend": "heuristic", "max_micro_batches": 16, "deterministic": True},
    }
    a = plan(problem_from_json(doc)).to_json(shards=False)
    b = plan(problem_from_json(doc)).to_json(shards=False)
    for x in (a, b):
        x["solver"].pop("wall_ms")
        x["solver"].pop("details", None)
        x["solver"].pop("trace", None)
    assert a == b


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
field_names = st.sampled_from(
    [
        "samples",
        "id",
        "text_tokens",
        "images",
        "videos",
        "tokens",
        "frames",
        "width",
        "height",
        "nodes",
        "gpus_per_node",
        "gpu",
        "llm",
        "layers",
        "hidden",
        "heads",
        "time",
        "comm",
        "scheme",
        "options",
        "max_degree",
        "time_budget_ms",
        "capacity_tokens_per_rank",
        "bandwidth_bytes_per_s",
        "intra",
        "inter",
    ]
)
documents = st.recursive(
    json_values,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(field_names, children, max_size=5),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {"batch": documents},
        optional={"cluster": documents, "model": documents, "profile": documents, "options": documents},
    )
)
def test_any_json_gives_a_problem_or_a_named_error(doc):
    """Whatever JSON arrives, the translation answers with a problem or an error naming a field: never a crash."""
    from optimizer.errors import PlannerError

    try:
        problem = problem_from_json(doc)
    except PlannerError as exc:
        assert exc.field and exc.hint
        return
    try:
        plan(problem)
    except InfeasibleError as exc:
        assert exc.field and exc.hint


leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4)
    | st.lists(st.integers(-5, 5), max_size=2)
)
image = st.dictionaries(st.sampled_from(["tokens", "frames", "tokens_per_frame", "width", "height"]), leaf, max_size=3)
sample = st.dictionaries(st.sampled_from(["id", "text_tokens"]), leaf, max_size=2) | st.fixed_dictionaries(
    {"id": st.text(min_size=1, max_size=3), "text_tokens": leaf},
    optional={"images": st.lists(image, max_size=2), "videos": st.lists(image, max_size=2)},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(sample, min_size=1, max_size=5),
    st.dictionaries(
        st.sampled_from(["nodes", "gpus_per_node", "tensor_parallel", "efficiency", "gpu"]), leaf, max_size=3
    ),
    st.dictionaries(
        st.sampled_from(["max_degree", "time_budget_ms", "max_micro_batches", "degree_policy", "backend", "cp_scheme"]),
        leaf,
        max_size=3,
    ),
)
def test_fuzzed_fields_give_a_plan_or_a_named_error(samples, cluster, options):
    from optimizer.errors import PlannerError

    doc = {
        "batch": {"samples": samples},
        "cluster": {"nodes": 1, **cluster},
        "model_preset": "qwen2-vl-7b",
        "options": {**options, "backend": "heuristic"},
    }
    try:
        problem = problem_from_json(doc)
        plan(problem)
    except PlannerError as exc:
        assert exc.field and exc.hint
