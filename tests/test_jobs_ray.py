"""Epoch planning jobs on Ray: a local instance (2 CPUs) started and stopped by this module gives
the same plan file, byte for byte, as the local engine; failed steps are reported as there."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray")
pytest.importorskip("pyarrow")

from jobs.engines import LocalEngine, RayEngine  # noqa: E402
from jobs.runner import run_job  # noqa: E402
from jobs.spec import job_from_json  # noqa: E402
from jobs.steps import build_epoch  # noqa: E402
from jobs.synthetic import synthetic_samples  # noqa: E402


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _epoch(samples):
    return build_epoch(
        job_from_json(
            {
                "dataset": {"samples": samples},
                "global_batch_size": 16,
                "sampler": {"kind": "length-grouped", "seed": 1, "group_batches": 2},
                "cluster": {"nodes": 2, "gpus_per_node": 4},
                "model_preset": "qwen2-vl-7b",
            }
        )
    )


def test_ray_plans_the_same_file_as_the_local_engine(ray_instance, tmp_path):
    samples = synthetic_samples(["video", "long-text"], 160, seed=5)
    samples[17]["text_tokens"] = 40_000_000  # too long for 8 ranks: its step fails, the others are planned
    engine = RayEngine()
    assert engine.workers == 2 and engine.describe()["nodes"] == 1
    on_ray = run_job(_epoch(samples), tmp_path / "ray", engine)
    engine.close()
    assert ray.is_initialized()  # an instance it did not start is left running
    local = run_job(_epoch(samples), tmp_path / "local", LocalEngine(1))
    assert on_ray.index["plan_file_sha256"] == local.index["plan_file_sha256"]
    assert (tmp_path / "ray" / "plan.parquet").read_bytes() == (tmp_path / "local" / "plan.parquet").read_bytes()
    summary = on_ray.index["summary"]
    assert summary["planned"] == 9 and summary["failed"] == 1
    failure = summary["failures"][0]
    assert failure["sample"] == samples[17]["id"] and failure["kind"] == "infeasible"
    assert samples[17]["id"] in on_ray.records[failure["step"]]["sample_ids"]
    assert on_ray.index["run"]["engine"] == "ray" and on_ray.index["run"]["planned_now"] == 10


def test_ray_job_stops_and_resumes(ray_instance, tmp_path):
    samples = synthetic_samples(["long-text"], 160, seed=6)
    seen = []
    stopped = run_job(
        _epoch(samples),
        tmp_path,
        RayEngine(),
        progress=lambda done, total, failed: seen.append(done),
        should_stop=lambda: len(seen) > 2,
    )
    assert stopped.status == "stopped" and 0 < stopped.done < 10
    resumed = run_job(_epoch(samples), tmp_path, RayEngine())
    assert resumed.status == "done" and resumed.reused == stopped.done and resumed.planned_now == 10 - stopped.done
    assert (
        resumed.index["plan_file_sha256"]
        == run_job(_epoch(samples), tmp_path / "straight", LocalEngine(1)).index["plan_file_sha256"]
    )
