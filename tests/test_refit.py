"""Refitting a profile from measured group times (optimizer.costs.refit): every term recovered from group times
alone, stragglers dropped, unseen terms kept and said so, untrustworthy fits refused."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import numpy as np
import pytest

from optimizer.costs.cp_schemes import ulysses_width
from optimizer.costs.nnls import nnls
from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.costs.refit import TERMS, MeasuredGroup, MeasuredPlan, fit_profile
from optimizer.errors import ProblemError
from optimizer.problem.documents import problem_from_json
from optimizer.problem.problem import Problem
from optimizer.problem.workloads import long_tail_video, mixed
from optimizer.verify.verifier import group_time

CLUSTER = {"nodes": 2, "gpus_per_node": 8}


def problem(seed: int, cluster=CLUSTER, scheme: str | None = None, n: int = 40, model: str = "qwen2-vl-7b") -> Problem:
    doc = {"batch": (mixed if seed % 2 else long_tail_video)(n, seed=seed), "cluster": cluster, "model_preset": model}
    if scheme:
        doc["options"] = {"cp_scheme": scheme}
    return problem_from_json(doc)


def truth_of(base: CostProfile) -> CostProfile:
    """A profile of the base's structure with every coefficient the fit can find moved."""
    return replace(
        base,
        quadratic=base.quadratic * 1.3,
        linear=base.linear * 0.7,
        sample_constant=base.sample_constant * 2 + 1e-4,
        group_constant=base.group_constant * 0.5 + 2e-3,
        intra_bandwidth=Bandwidth.constant(base.intra_bandwidth.at(8) * 0.6),
        inter_bandwidth=Bandwidth.constant(base.inter_bandwidth.at(8) * 0.4),
        intra_latency=base.intra_latency * 3 + 1e-5,
        inter_latency=base.inter_latency * 2 + 3e-5,
        sample_step=2e-5,
        vision_linear=base.vision_linear * 1.5,
        vision_quadratic=base.vision_quadratic * 0.8,
        ulysses_bytes_per_token=base.ulysses_bytes_per_token,
    )


def random_steps(
    problems: list[Problem], truth: CostProfile, seed: int = 0, noise: float = 0.0, stragglers: float = 0.0
) -> list[MeasuredPlan]:
    """Steps of random groupings (contiguous rank blocks of random sizes, some spanning nodes), timed by the
    verifier under ``truth``."""
    rng = np.random.default_rng(seed)
    out = []
    for k, p in enumerate(problems):
        real = replace(p, profile=truth)
        n, ranks = len(p.batch), p.domain_size
        order = rng.permutation(n)
        groups, mbs, start, r0 = [], [], 0, 0
        while start < n:
            d = int(rng.choice([1, 2, 3, 4, 6, 8, 12, 16]))
            if r0 + d > ranks:
                mbs.append(tuple(groups))
                groups, r0 = [], 0
                continue
            take = int(rng.integers(1, 5))
            samples = tuple(int(i) for i in order[start : start + take])
            ids = tuple(range(r0, r0 + d))
            seconds = group_time(real, ids, samples)[0] * (1 + noise * rng.standard_normal())
            if rng.random() < stragglers:
                seconds *= 2.5
            u = ulysses_width(real, d)
            groups.append(MeasuredGroup(ids, samples, u, seconds))
            start += take
            r0 += d
        if groups:
            mbs.append(tuple(groups))
        total = sum(max(g.seconds for g in mb) for mb in mbs)
        out.append(MeasuredPlan(f"s{k}", p, tuple(mbs), total + 0.05))
    return out


def recovered(fit, truth: CostProfile) -> dict[str, float]:
    want = {
        "quadratic": truth.quadratic,
        "linear": truth.linear,
        "sample_constant": truth.sample_constant,
        "group_constant": truth.group_constant,
        "intra_seconds_per_byte": 1 / truth.intra_bandwidth.at(2),
        "inter_seconds_per_byte": 1 / truth.inter_bandwidth.at(2),
        "intra_latency": truth.intra_latency,
        "inter_latency": truth.inter_latency,
        "sample_step": truth.sample_step,
        "vision_linear": truth.vision_linear,
        "vision_quadratic": truth.vision_quadratic,
    }
    return {k: abs(fit.terms[k]["value"] - v) / v for k, v in want.items() if v > 0}


@pytest.mark.parametrize("scheme", ["ring", "ulysses", "hybrid"])
def test_every_term_is_recovered_from_group_times_alone(scheme):
    problems = [problem(s, scheme=scheme) for s in range(10)]
    base = problems[0].cost_profile
    truth = truth_of(base)
    if scheme == "ulysses":  # the all-to-all's messages per sample and sample_step both grow as d - 1
        truth = replace(truth, sample_step=0.0)
    steps = random_steps(problems, truth)
    fit = fit_profile(steps)
    errors = recovered(fit, truth)
    seen = {k for k, e in fit.terms.items() if e["fitted"]}
    if scheme == "ulysses":
        assert "cannot tell it apart from intra_latency" in fit.terms["sample_step"]["reason"]
    else:  # ring: the overlap rule tells the messages from sample_step; hybrid: its message steps are not d - 1
        assert seen == set(TERMS)
    assert max(errors[k] for k in seen if k in errors) < 1e-6, errors
    assert fit.profile.step_constant == pytest.approx(0.05)
    assert fit.held_out_after is not None and fit.held_out_after.groups[1] < 1e-9
    assert fit.held_out_before is not None and fit.held_out_before.groups[0] > 0.05


def test_noise_and_stragglers_leave_a_close_fit():
    problems = [problem(s) for s in range(16)]
    truth = truth_of(problems[0].cost_profile)
    fit = fit_profile(random_steps(problems, truth, seed=1, noise=0.03, stragglers=0.03))
    assert fit.stragglers > 0
    fresh = [problem(s) for s in range(100, 104)]
    errors = [
        abs(group_time(replace(p, profile=fit.profile), g.ranks, g.samples)[0] / g.seconds - 1)
        for step in random_steps(fresh, truth, seed=2)
        for p in [step.problem]
        for mb in step.groups
        for g in mb
    ]
    assert np.mean(errors) < 0.02 and max(errors) < 0.08, (np.mean(errors), max(errors))


def test_a_term_no_group_exercises_keeps_the_base_value_and_says_why():
    one_node = {"nodes": 1, "gpus_per_node": 16}
    problems = [problem(s, cluster=one_node) for s in range(8)]
    base = problems[0].cost_profile
    fit = fit_profile(random_steps(problems, truth_of(base)))
    inter = fit.terms["inter_seconds_per_byte"]
    assert not inter["fitted"] and "spans nodes" in inter["reason"]
    assert fit.profile.inter_bandwidth == base.inter_bandwidth
    assert fit.terms["intra_seconds_per_byte"]["fitted"]


def test_untrustworthy_fits_are_refused_with_the_rule():
    problems = [problem(s) for s in range(8)]
    truth = truth_of(problems[0].cost_profile)
    steps = random_steps(problems, truth)
    with pytest.raises(ProblemError, match="too few") as few:
        fit_profile(steps[:2])
    assert few.value.field == "plan_ids"
    flat = [replace(s, groups=tuple(tuple(replace(g, seconds=0.5) for g in mb) for mb in s.groups)) for s in steps]
    with pytest.raises(ProblemError) as constant:
        fit_profile(flat)
    assert constant.value.field in ("plan_ids", "min_r2")
    noisy = random_steps(problems, truth, seed=3, noise=0.3)
    with pytest.raises(ProblemError) as loose:
        fit_profile(noisy, min_r2=0.999)
    assert loose.value.field == "min_r2"
    other = replace(steps[1], problem=problem(1, model="llama3-8b"))
    with pytest.raises(ProblemError, match="another form"):
        fit_profile([steps[0], other])


def test_nnls_finds_the_constrained_minimum():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.standard_normal((12, 4))
        b = rng.standard_normal(12)
        x = nnls(a, b)
        assert (x >= 0).all()
        best = float(np.linalg.norm(b))  # x = 0
        for k in range(1, 5):
            for cols in itertools.combinations(range(4), k):
                sol = np.linalg.lstsq(a[:, list(cols)], b, rcond=None)[0]
                if (sol >= 0).all():
                    best = min(best, float(np.linalg.norm(a[:, list(cols)] @ sol - b)))
        assert np.linalg.norm(a @ x - b) <= best + 1e-9


def test_plans_made_with_a_refit_are_fitted_with_those_made_before_it():
    problems = [problem(s) for s in range(8)]
    truth = truth_of(problems[0].cost_profile)
    first = fit_profile(random_steps(problems[:4], truth))
    later = [replace(p, profile=first.profile) for p in problems[4:]]
    both = fit_profile(random_steps(problems[:4], truth) + random_steps(later, truth, seed=5))
    assert max(recovered(both, truth).values()) < 1e-6
    assert both.plans == 8 and both.held_out_before is not None


def test_the_synthetic_check_runs_and_the_refit_beats_the_base(tmp_path, capsys):
    from bench import refit_check

    out = tmp_path / "check.json"
    refit_check.main(["--nodes", "2", "--samples", "32", "--steps", "10", "--fresh", "2", "--json", str(out)])
    figures = json.loads(out.read_text())
    for part in ("held_out", "replanned_noiseless"):
        assert figures[part]["after"]["groups"]["mean"] < figures[part]["before"]["groups"]["mean"]
    assert "held_out" in capsys.readouterr().out
