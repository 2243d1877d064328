"""Shared fixtures: small problems built from presets and generated batches."""

from __future__ import annotations

import pytest

from optimizer.problem.documents import problem_from_json
from optimizer.problem.workloads import long_tail_video


@pytest.fixture
def make_problem():
    def make(batch=None, cluster_preset="h100-8x8", model_preset="qwen2-vl-7b", **options):
        doc = {"batch": batch or long_tail_video(64, seed=0), "cluster_preset": cluster_preset, "model_preset": model_preset}
        if options:
            doc["options"] = options
        return problem_from_json(doc)

    return make
