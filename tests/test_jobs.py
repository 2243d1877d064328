"""Epoch planning jobs on the local engine: end to end, resume after a kill, identical plans across
worker counts and dataset formats, bad inputs, samplers and the trainer-side reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("pyarrow")

from api.cli.main import main as dhp  # noqa: E402
from jobs import planfile  # noqa: E402
from jobs.dataset import write_jsonl, write_parquet  # noqa: E402
from jobs.engines import LocalEngine  # noqa: E402
from jobs.runner import run_job  # noqa: E402
from jobs.samplers import epoch_steps  # noqa: E402
from jobs.spec import SamplerSpec, job_from_json  # noqa: E402
from jobs.steps import build_epoch  # noqa: E402
from jobs.synthetic import synthetic_samples  # noqa: E402
from optimizer.errors import ProblemError  # noqa: E402
from trainer.epoch_plan import EpochPlan, planned_batch_sampler  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = {"cluster": {"nodes": 2, "gpus_per_node": 4}, "model_preset": "qwen2-vl-7b"}


def _job(samples, size=24, **extra):
    return job_from_json({"dataset": {"samples": samples}, "global_batch_size": size, **CLUSTER, **extra})


@pytest.fixture(scope="module")
def samples():
    return synthetic_samples(["video", "long-text"], 240, seed=3)


@pytest.fixture(scope="module")
def straight(samples, tmp_path_factory):
    """The epoch planned in this process, straight through: the reference for every other run."""
    out = tmp_path_factory.mktemp("straight")
    result = run_job(build_epoch(_job(samples, sampler={"kind": "shuffle", "seed": 7})), out, LocalEngine(1))
    return result


def test_epoch_end_to_end_on_one_process(straight, samples):
    assert straight.status == "done" and straight.total == 10 and straight.planned_now == 10
    index = straight.index
    assert index["summary"]["planned"] == 10 and index["summary"]["failed"] == 0
    table = planfile.read_plan_table(straight.directory)
    assert table.column("step").to_pylist() == list(range(10))
    # every sample of the dataset is planned exactly once over the epoch, each in the step the sampler put it
    ids = [sid for step in table.column("sample_ids").to_pylist() for sid in step]
    assert sorted(ids) == sorted(s["id"] for s in samples)
    for step, plan_text, sids in zip(
        range(10), table.column("plan").to_pylist(), table.column("sample_ids").to_pylist(), strict=True
    ):
        plan = json.loads(plan_text)
        planned = sorted(s for mb in plan["micro_batches"] for g in mb["groups"] for s in g["samples"])
        assert planned == sorted(sids), step
    summary = index["summary"]
    predicted = sum(table.column("predicted_step_time_s").to_pylist())
    assert summary["predicted_epoch_time_s"] == pytest.approx(predicted)
    assert summary["static_per_step"]["epoch_time_s"] >= predicted * (1 - 1e-9)
    assert summary["static_mesh"]["epoch_time_s"] >= summary["static_per_step"]["epoch_time_s"] * (1 - 1e-9)
    news = table.column("new_communicators").to_pylist()
    assert news[0] == table.column("communicators").to_pylist()[0] and summary["new_communicators"]["distinct"] == sum(
        news
    )
    assert 0 <= summary["gap"]["median"] <= summary["gap"]["max"] < 1


def test_same_bytes_on_a_pool_of_two_and_from_parquet(straight, samples, tmp_path):
    data = tmp_path / "samples.parquet"
    write_parquet(data, samples)
    epoch = build_epoch(
        job_from_json(
            {
                "dataset": {"path": str(data)},
                "global_batch_size": 24,
                "sampler": {"kind": "shuffle", "seed": 7},
                **CLUSTER,
            }
        )
    )
    result = run_job(epoch, tmp_path / "pool", LocalEngine(2))
    assert result.index["plan_file_sha256"] == straight.index["plan_file_sha256"]
    assert (tmp_path / "pool" / "plan.parquet").read_bytes() == (straight.directory / "plan.parquet").read_bytes()
    assert result.index["run"] == {**result.index["run"], "engine": "local", "workers": 2, "planned_now": 10}


def test_kill_and_resume_plans_no_step_twice(tmp_path):
    data = tmp_path / "samples.jsonl"
    write_jsonl(data, synthetic_samples(["video"], 48 * 32, seed=1))
    out = tmp_path / "job"
    argv = [
        sys.executable,
        "-m",
        "api.cli.main",
        "plan-epoch",
        "--dataset",
        str(data),
        "--global-batch-size",
        "32",
        "--nodes",
        "8",
        "--model-preset",
        "qwen2-vl-7b",
        "--workers",
        "1",
        "--no-progress",
        "--keep-journal",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    journal = out / planfile.JOURNAL_FILE
    deadline = time.monotonic() + 60
    lines = 0
    while time.monotonic() < deadline and proc.poll() is None:
        lines = journal.read_bytes().count(b"\n") - 1 if journal.exists() else 0
        if lines >= 16:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the job ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {json.loads(line)["step"] for line in journal.read_text().splitlines()[1:] if line.strip().endswith("}")}
    assert 16 <= len(before) < 48 and not (out / planfile.PLAN_FILE).exists()
    assert dhp(argv[3:]) == 0
    index = json.loads((out / planfile.INDEX_FILE).read_text())
    assert index["run"]["reused_from_journal"] == len(before) and index["run"]["planned_now"] == 48 - len(before)
    steps = [
        json.loads(line)["step"] for line in (out / "journal.jsonl.done").read_text().splitlines()[1:] if line.strip()
    ]
    assert len(steps) == len(set(steps)) == 48  # no step planned twice
    assert not journal.exists()
    # the resumed file is the file of a run that was never interrupted
    again = dhp([*argv[3:-1], str(tmp_path / "straight")])
    assert again == 0
    assert (tmp_path / "straight" / "plan.parquet").read_bytes() == (out / "plan.parquet").read_bytes()
    # a finished job is not planned again
    rerun = run_job(
        build_epoch(
            job_from_json(
                {
                    "dataset": {"path": str(data)},
                    "global_batch_size": 32,
                    "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "H100-SXM"},
                    "model_preset": "qwen2-vl-7b",
                }
            )
        ),
        out,
        LocalEngine(1),
    )
    assert rerun.planned_now == 0 and rerun.reused == 48


def test_bad_samples_fail_their_step_only(tmp_path, capsys):
    rows = synthetic_samples(["long-text"], 48, seed=2)
    rows[5] = {"text_tokens": 100}  # no id
    rows[30]["text_tokens"] = 50_000_000  # too long for 8 ranks
    rows[45] = {
        "id": "bad-image",
        "text_tokens": 10,
        "images": [{"width": 0, "height": 10}],
    }  # found when its step is planned
    data = tmp_path / "bad.jsonl"
    write_jsonl(data, rows)
    code = dhp(
        [
            "plan-epoch",
            "--dataset",
            str(data),
            "--global-batch-size",
            "8",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "--model-preset",
            "llama3-8b",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "step 0" in err and "dataset[5].id" in err and "is required" in err
    assert f"step 3 sample {rows[30]['id']!r}" in err and "largest allowed group" in err
    assert "step 5 sample 'bad-image': batch.samples[5].images[0]: 0x10 is not a valid size" in err
    plan = EpochPlan(tmp_path / "out")
    assert plan.failed_steps == [0, 3, 5] and len(plan) == 6
    plan.work(1, 0)  # the other steps have plans
    with pytest.raises(ProblemError, match=f"step 3 has no plan \\(sample '{rows[30]['id']}'\\)"):
        plan.work(3, 0)
    # only the too-long sample: exit 3 (valid input, no plan satisfies that step)
    rows[5] = {"id": "fixed", "text_tokens": 100}
    rows[45] = {"id": "fixed-too", "text_tokens": 100}
    write_jsonl(data, rows)
    assert (
        dhp(
            [
                "plan-epoch",
                "--dataset",
                str(data),
                "--global-batch-size",
                "8",
                "--nodes",
                "2",
                "--gpus-per-node",
                "4",
                "--model-preset",
                "llama3-8b",
                "--no-progress",
                "--out",
                str(tmp_path / "out2"),
            ]
        )
        == 3
    )


@pytest.mark.parametrize(
    "doc, field",
    [
        ({"dataset": {"samples": [{"id": "a", "text_tokens": 5}]}}, "global_batch_size"),
        (
            {
                "dataset": {"samples": [{"id": "a", "text_tokens": 5}]},
                "global_batch_size": 1,
                "sampler": {"kind": "random"},
            },
            "sampler.kind",
        ),
        ({"global_batch_size": 4}, "dataset"),
        ({"batches": [{"samples": []}]}, "batches[0]"),
        (
            {
                "dataset": {"samples": [{"id": "a", "text_tokens": 5}, {"id": "a", "text_tokens": 6}]},
                "global_batch_size": 1,
            },
            "dataset[1].id",
        ),
        (
            {"dataset": {"samples": [{"id": "a", "text_tokens": 5}]}, "global_batch_size": 2, "drop_last": True},
            "global_batch_size",
        ),
        (
            {"dataset": {"samples": [{"id": "a", "text_tokens": 5}]}, "global_batch_size": 1, "cluster_preset": "nope"},
            "cluster_preset",
        ),
        (
            {
                "dataset": {"samples": [{"id": "a", "text_tokens": 5}]},
                "global_batch_size": 1,
                "options": {"backend": "magic"},
            },
            "options.backend",
        ),
    ],
)
def test_bad_job_documents_name_the_field(doc, field):
    with pytest.raises(ProblemError) as exc:
        build_epoch(job_from_json(doc))
    assert exc.value.field == field


def test_cli_bad_input_exit_2_one_line(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"dataset": {"path": str(tmp_path / "missing.jsonl")}, "global_batch_size": 4}))
    proc = subprocess.run(
        [sys.executable, "-m", "api.cli.main", "plan-epoch", "--job", str(job), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (
        proc.returncode == 2
        and proc.stderr.startswith("error: dataset.path: cannot read")
        and "Traceback" not in proc.stderr
    )


def test_resuming_with_other_inputs_is_refused(samples, straight, tmp_path):
    out = tmp_path / "job"
    run_job(build_epoch(_job(samples[:48], size=24)), out, LocalEngine(1), should_stop=lambda: True)
    assert (out / planfile.JOURNAL_FILE).exists()
    with pytest.raises(ProblemError, match="other inputs") as exc:
        run_job(build_epoch(_job(samples[:48], size=12)), out, LocalEngine(1))
    assert exc.value.field == "--out"
    assert run_job(build_epoch(_job(samples[:48], size=12)), out, LocalEngine(1), fresh=True).status == "done"


def test_explicit_batches_are_planned_as_given(tmp_path):
    batches = [{"samples": synthetic_samples(["video"], n, seed=n)} for n in (5, 9, 3)]
    for k, b in enumerate(batches):
        for s in b["samples"]:
            s["id"] = f"b{k}-{s['id']}"
    result = run_job(build_epoch(job_from_json({"batches": batches, **CLUSTER})), tmp_path, LocalEngine(1))
    ids = planfile.read_plan_table(tmp_path).column("sample_ids").to_pylist()
    assert ids == [[s["id"] for s in b["samples"]] for b in batches] and result.index["summary"]["planned"] == 3


def test_samplers():
    lengths = np.random.default_rng(0).integers(1, 10_000, size=103)
    for kind in ("sequential", "shuffle", "length-grouped"):
        spec = SamplerSpec(kind=kind, seed=4, group_batches=3)
        steps = epoch_steps(lengths, 10, spec, drop_last=False)
        assert sorted(np.concatenate(steps).tolist()) == list(range(103)) and len(steps) == 11
        assert [s.tolist() for s in steps] == [s.tolist() for s in epoch_steps(lengths, 10, spec, drop_last=False)]
        assert len(epoch_steps(lengths, 10, spec, drop_last=True)) == 10
    assert np.concatenate(epoch_steps(lengths, 10, SamplerSpec("sequential"), False)).tolist() == list(range(103))
    a = epoch_steps(lengths, 10, SamplerSpec("shuffle", seed=4, epoch=0), False)
    b = epoch_steps(lengths, 10, SamplerSpec("shuffle", seed=4, epoch=1), False)
    assert np.concatenate(a).tolist() != np.concatenate(b).tolist()
    grouped = epoch_steps(lengths, 10, SamplerSpec("length-grouped", seed=4, group_batches=3), False)
    assert int(lengths[grouped[0]].max()) == int(lengths.max())  # the longest sample's step first
    full = [s for s in grouped if len(s) == 10]
    spread = np.mean([np.ptp(lengths[s]) for s in full])
    shuffled = np.mean([np.ptp(lengths[s]) for s in a if len(s) == 10])
    assert spread < 0.5 * shuffled  # steps of similar lengths


def test_loader_gives_every_rank_its_work(straight, samples):
    torch = pytest.importorskip("torch")
    plan = EpochPlan(straight.directory)
    ids = [s["id"] for s in samples]
    table = planfile.read_plan_table(straight.directory, ["sample_ids"]).column("sample_ids").to_pylist()
    for step in (0, 9):
        held: dict[str, int] = {}
        for rank in range(8):
            sw = plan.work(step, rank)
            for mb in sw.work.micro_batches:
                for shard in mb.shards:
                    held[shard.sample] = held.get(shard.sample, 0) + shard.tokens
        lengths = {s["id"]: s for s in samples}
        assert sorted(held) == sorted(table[step])
        assert all(held[sid] > 0 for sid in held) and len(lengths)  # every sample's tokens are held somewhere
    sampler = planned_batch_sampler(straight.directory, 3, ids)
    loader = torch.utils.data.DataLoader(list(range(len(ids))), batch_sampler=sampler, collate_fn=lambda b: b)
    batches = list(loader)
    assert len(batches) == len(sampler) == 10
    works = list(sampler.works())
    for batch, sw in zip(batches, works, strict=True):
        assert [ids[i] for i in batch] == list(sw.sample_ids)


def test_example_trains_from_a_planned_epoch(tmp_path):
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "examples/planned_epoch.py", "--steps", "1", "--batch", "6", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "step 0: loss" in proc.stderr
        and "equal on all 2 ranks: True" in proc.stderr
        and "equal on all 2 ranks: False" not in proc.stderr
    )
    assert (
        EpochPlan(tmp_path / "plan").index["summary"]["new_communicators"]["distinct"] >= 1
    )  # long samples ran on a group of 2
