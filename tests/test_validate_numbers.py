"""``dhp validate`` checks every number of a plan file: its type, that it is finite and in range, and
that it agrees with what the verifier recomputes from the batch, cluster and profile.

A plan printed by ``dhp plan`` validates; each mutation of one field fails with exit code 1 and one
line that names the field's path. A file that is not a JSON object stays bad input (exit 2).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from api.cli.main import main
from optimizer.problem.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parents[1]
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A small batch, and the plans ``dhp plan`` prints for it on one node and on two nodes of 8 GPUs."""
    folder = tmp_path_factory.mktemp("validate")
    batch = folder / "batch.json"
    batch.write_text(json.dumps(WORKLOADS["image-sft"](24, seed=1)))
    out = {"batch": batch}
    for nodes in (1, 2):
        plan_file = folder / f"plan{nodes}.json"
        assert (
            main(
                [
                    "plan",
                    "--batch",
                    str(batch),
                    "--nodes",
                    str(nodes),
                    "--gpus-per-node",
                    "8",
                    "--backend",
                    "heuristic",
                    "--out",
                    str(plan_file),
                ]
            )
            == 0
        )
        out[f"plan{nodes}"] = plan_file
    return out


@pytest.fixture()
def plan(files) -> Doc:
    doc: Doc = json.loads(files["plan1"].read_text())
    # The mutations below need a static baseline, a micro-batch with a group of several ranks and a gap.
    assert doc["static_baseline"] and len(doc["micro_batches"]) >= 2 and doc["gap"] > 0
    assert doc["micro_batches"][0]["groups"][0]["degree"] > 1
    return doc


def validate(
    capsys, files, doc: Doc | str, tmp_path, nodes: int = 1, batch: Path | None = None, extra: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    code = main(
        [
            "validate",
            "--plan",
            str(plan_file),
            "--batch",
            str(batch or files["batch"]),
            "--nodes",
            str(nodes),
            "--gpus-per-node",
            "8",
            *extra,
        ]
    )
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out.strip().splitlines()


def _set(path: str, value: Any) -> Callable[[Doc], None]:
    """A mutation that sets the field at ``path`` (``a.b[2].c``) to ``value``."""

    def mutate(doc: Doc) -> None:
        parent, key = _locate(doc, path)
        parent[key] = value

    return mutate


def _drop(path: str) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        parent, key = _locate(doc, path)
        del parent[key]

    return mutate


def _scale(path: str, factor: float) -> Callable[[Doc], None]:
    def mutate(doc: Doc) -> None:
        parent, key = _locate(doc, path)
        parent[key] *= factor

    return mutate


def _locate(doc: Doc, path: str) -> tuple[Any, Any]:
    keys: list[Any] = []
    for part in path.split("."):
        name, *indices = part.replace("]", "").split("[")
        keys.append(name)
        keys.extend(int(i) for i in indices)
    node: Any = doc
    for key in keys[:-1]:
        node = node[key]
    return node, keys[-1]


def _bound_10x(doc: Doc) -> None:
    doc["lower_bound_s"] = 10 * doc["predicted_step_time_s"]


def _shard_length(doc: Doc) -> None:
    doc["micro_batches"][0]["groups"][0]["shards"][0]["length"] += 1


def _one_communicator_less(doc: Doc) -> None:
    doc["communicators"].pop()


G = "micro_batches[1].groups[0]"
MUTATIONS: dict[str, tuple[Callable[[Doc], None], str]] = {
    "step NaN": (_set("predicted_step_time_s", math.nan), "predicted_step_time_s: is NaN"),
    "step infinite": (_set("predicted_step_time_s", math.inf), "predicted_step_time_s: is infinite"),
    "step a string": (_set("predicted_step_time_s", "fast"), "predicted_step_time_s: is the string 'fast'"),
    "step a bool": (_set("predicted_step_time_s", True), "predicted_step_time_s: is true"),
    "step missing": (_drop("predicted_step_time_s"), "predicted_step_time_s: is missing"),
    "step too large": (_set("predicted_step_time_s", 10**400), "predicted_step_time_s: is too large"),
    "step off": (_scale("predicted_step_time_s", 1.5), "predicted_step_time_s:"),
    "group time NaN": (_set(f"{G}.predicted_time_s", math.nan), f"{G}.predicted_time_s: is NaN"),
    "group time 1e-9": (_set(f"{G}.predicted_time_s", 1e-9), f"{G}.predicted_time_s:"),
    "group time negative": (_set(f"{G}.predicted_time_s", -0.1), f"{G}.predicted_time_s: is negative"),
    "group time missing": (_drop(f"{G}.predicted_time_s"), f"{G}.predicted_time_s: is missing"),
    "intra_node a string": (_set(f"{G}.intra_node", "yes"), f"{G}.intra_node:"),
    "intra_node wrong": (_set(f"{G}.intra_node", False), f"{G}.intra_node:"),
    "micro-batch time off": (_scale("micro_batches[0].predicted_time_s", 0.5), "micro_batches[0].predicted_time_s:"),
    "lower bound 10x": (_bound_10x, "lower_bound_s:"),
    "lower bound NaN": (_set("lower_bound_s", math.nan), "lower_bound_s: is NaN"),
    "gap off": (_set("gap", 0.5), "gap:"),
    "ratio off": (_set("ratio_to_bound", 2.0), "ratio_to_bound:"),
    "degree 999": (_set("micro_batches[0].groups[0].degree", 999), "micro_batches[0].groups[0].degree: is 999"),
    "degree a string": (
        _set("micro_batches[0].groups[0].degree", "3"),
        "micro_batches[0].groups[0].degree: is the string '3'",
    ),
    "domain_size a float": (_set("domain_size", 8.0), "domain_size:"),
    "scheme unknown": (_set("scheme", "zigzag"), "scheme:"),
    "static step NaN": (
        _set("static_baseline.predicted_step_time_s", math.nan),
        "static_baseline.predicted_step_time_s: is NaN",
    ),
    "static degree 999": (_set("static_baseline.degree", 999), "static_baseline.degree:"),
    "static micro-batches 0": (_set("static_baseline.micro_batches", 0), "static_baseline.micro_batches:"),
    "static speedup off": (_set("static_baseline.speedup", 9.0), "static_baseline.speedup:"),
    "shard length off": (_shard_length, "micro_batches[0].groups[0].shards[0].length:"),
    "communicators off": (_one_communicator_less, "communicators:"),
    "solver wall time NaN": (_set("solver.wall_ms", math.nan), "solver.wall_ms: is NaN"),
}


def test_the_plan_as_printed_validates(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path)
    assert code == 0 and lines[0].startswith("valid:"), lines


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_wrong_number_fails_with_one_line_naming_it(capsys, files, plan, tmp_path, name):
    mutate, start = MUTATIONS[name]
    mutate(plan)
    code, lines = validate(capsys, files, plan, tmp_path)
    assert code == 1, lines
    assert len(lines) == 1 and lines[0].startswith(f"invalid: {start}"), lines


def test_a_nan_token_in_the_file_is_read_and_reported(capsys, files, plan, tmp_path):
    text = json.dumps(plan).replace(json.dumps(plan["lower_bound_s"]), "NaN", 1)
    assert "NaN" in text
    code, lines = validate(capsys, files, text, tmp_path)
    assert code == 1 and lines == ["invalid: lower_bound_s: is NaN"], lines


OTHER_CLUSTER = "validate it against the cluster it was planned for, or plan the batch again for this one"


def test_a_plan_for_more_ranks_than_the_cluster_has_is_one_line(capsys, files, tmp_path):
    doc = json.loads(files["plan2"].read_text())
    code, lines = validate(capsys, files, doc, tmp_path, nodes=1)
    assert code == 1 and lines == [
        f"invalid: this plan is for 16 ranks, the cluster has 8 (domain_size): {OTHER_CLUSTER}"
    ]


def test_a_plan_for_fewer_ranks_than_the_cluster_has_is_one_line(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path, nodes=2)
    assert code == 1 and lines == [
        f"invalid: this plan is for 8 ranks, the cluster has 16 (domain_size): {OTHER_CLUSTER}"
    ]


def _other_batch(tmp_path, renamed: bool) -> Path:
    """A batch of as many samples with other lengths: with other ids (``renamed``), or the plan's ids."""
    doc = WORKLOADS["image-sft"](24, seed=2)
    if renamed:
        for sample in doc["samples"]:
            sample["id"] = "other-" + sample["id"]
    path = tmp_path / "other_batch.json"
    path.write_text(json.dumps(doc))
    return path


def _capped(lines: list[str], lead: str) -> list[str]:
    """The details after the leading line, checking the cap: ten lines, then how many more."""
    assert lines[0].startswith(f"invalid: {lead}"), lines
    assert len(lines) == SHOWN + 1 and re.fullmatch(r"invalid: \.\.\. \d+ more", lines[-1]), lines
    return lines[1:-1]


SHOWN = 10


def test_a_plan_for_another_batch_leads_with_the_ids_it_lacks(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path, batch=_other_batch(tmp_path, renamed=True))
    assert code == 1
    details = _capped(lines, "24 of the plan's 24 sample ids are not in the batch, e.g. [")
    assert "(samples): validate the plan against the batch it was planned for" in lines[0]
    assert all(re.match(r"invalid: micro_batches\[\d+\]\.groups\[\d+\]\.samples: names samples", d) for d in details)


def test_a_plan_for_a_batch_of_other_lengths_leads_with_them(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path, batch=_other_batch(tmp_path, renamed=False))
    assert code == 1
    _capped(lines, "24 of the plan's 24 samples have other lengths than the batch's samples of the same ids")


def test_a_plan_for_another_scheme_leads_with_it(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path, extra=("--cp-scheme", "ulysses"))
    assert code == 1
    details = _capped(lines, "this plan is for ring context parallelism, the profile's scheme is ulysses (scheme): ")
    assert all(".shards[" in d for d in details), details


def test_a_plan_for_another_gpu_leads_with_its_times(capsys, files, plan, tmp_path):
    code, lines = validate(capsys, files, plan, tmp_path, extra=("--gpu", "A100-80GB"))
    groups = sum(len(mb["groups"]) for mb in plan["micro_batches"])
    assert code == 1
    details = _capped(lines, f"{groups} of the plan's {groups} group times are not what this batch, cluster")
    assert all(".predicted_time_s: predicted" in d for d in details), details


@pytest.mark.parametrize("content", ["[1, 2]", '{"micro_batches": [', '"plan"', "NaN"])
def test_a_file_that_is_not_a_plan_object_is_bad_input(files, tmp_path, content):
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(content)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.cli.main",
            "validate",
            "--plan",
            str(plan_file),
            "--batch",
            str(files["batch"]),
            "--nodes",
            "1",
            "--gpus-per-node",
            "8",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "plan" in lines[0] and "Traceback" not in proc.stderr, (
        proc.stderr
    )
