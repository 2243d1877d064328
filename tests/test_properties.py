"""Properties on random inputs: a valid problem gives a verified plan or a clear infeasibility error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from optimizer.documents import problem_from_json
from optimizer.errors import InfeasibleError
from optimizer.planner import plan
from optimizer.verify import verify

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
        "degree_policy": draw(st.sampled_from(["any", "pow2"])),
        "max_micro_batches": draw(st.integers(1, 12)),
        "cp_scheme": draw(st.sampled_from(["ring", "ulysses"])),
    }
    if draw(st.booleans()):
        options["max_degree"] = draw(st.integers(1, nodes * per_node))
    return {"batch": {"samples": samples}, "cluster": {"nodes": nodes, "gpus_per_node": per_node},
            "model_preset": draw(st.sampled_from(["internvl2-8b", "qwen2-vl-7b"])), "options": options}


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
    from optimizer.workloads import mixed

    doc = {"batch": mixed(48, seed=seed), "cluster": {"nodes": 2, "gpus_per_node": 8}, "model_preset": "qwen2-vl-7b",
           "options": {"backend": "heuristic", "max_micro_batches": 16}}
    a = plan(problem_from_json(doc)).to_json(shards=False)
    b = plan(problem_from_json(doc)).to_json(shards=False)
    for x in (a, b):
        x["solver"].pop("wall_ms")
        x["solver"].pop("details", None)
        x["solver"].pop("trace", None)
    assert a == b
