from optimizer.verify.verifier import verify
from planning.planner import plan


def test_plan_video_batch_is_verified(make_problem):
    problem = make_problem(backend="heuristic")
    result = plan(problem)
    assert verify(result, problem).ok
    assert result.lower_bound_s <= result.predicted_step_time_s
    assert sorted(s for mb in result.micro_batches for g in mb.groups for s in g.samples) == sorted(
        s.id for s in problem.batch.samples
    )
