"""The compiled loops and their plain-Python form (numba absent or NUMBA_DISABLE_JIT=1) give the same plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimizer import jit

SCRIPT = """
import json, sys
from optimizer.problem.documents import problem_from_json
from planning.planner import plan
from optimizer.problem.workloads import image_sft, long_tail_video
docs = [
    {"batch": long_tail_video(48, seed=5), "cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b"},
    {"batch": image_sft(40, seed=2), "cluster_preset": "mixed-h100-a100", "model_preset": "internvl2-8b"},
]
out = []
for doc in docs:
    p = plan(problem_from_json(dict(doc, options={"backend": "heuristic", "time_budget_ms": 600000})))
    out.append({"step": p.predicted_step_time_s, "bound": p.lower_bound_s,
                "static": p.static_baseline.predicted_step_time_s,
                "groups": [[list(g.ranks), list(g.samples)] for mb in p.micro_batches for g in mb.groups]})
print(json.dumps(out))
"""


def _run(disable: bool) -> list:
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1" if disable else "0"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[1],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not jit.HAVE_NUMBA, reason="numba is not installed: only the plain-Python form exists")
def test_compiled_and_plain_python_plans_agree() -> None:
    compiled, plain = _run(False), _run(True)
    assert [c["groups"] for c in compiled] == [p["groups"] for p in plain]
    for c, p in zip(compiled, plain, strict=True):
        for key in ("step", "bound", "static"):
            assert c[key] == pytest.approx(p[key], rel=1e-12)


def test_warm_up_runs_once_and_plans_cleanly() -> None:
    script = (
        "import json; import planning.warm as warm; from planning.planner import warm_up; "
        "first = warm_up(); second = warm_up(); "
        "print(json.dumps([first, second, warm.last_error]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second, error = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first > 0 and second == 0 and error is None


def test_kernels_compile_without_a_writable_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    if not jit.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    calls = []

    def fake_njit(**options):
        calls.append(options)
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return lambda fn: ("compiled", fn)

    monkeypatch.setattr(jit, "_njit", fake_njit)

    def f(x):
        return x

    assert jit.compiled(f) == ("compiled", f)
    assert [c.get("cache", False) for c in calls] == [True, False]


LOAD_SCRIPT = """
import importlib, json, pkgutil
import optimizer
from numba.core.imputils import builtin_registry
from numba.core.registry import CPUDispatcher, cpu_target
from planning.planner import warm_up
warm_up()
mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(optimizer.__path__, "optimizer.")]
kernels = [v for m in mods for v in vars(m).values() if isinstance(v, CPUDispatcher)]
print(json.dumps({"hits": sum(sum(k._cache_hits.values()) for k in kernels),
                  "misses": sum(sum(k._cache_misses.values()) for k in kernels),
                  "registries": builtin_registry in cpu_target.target_context._registries}))
"""


@pytest.mark.skipif(not jit.HAVE_NUMBA, reason="numba is not installed")
def test_cached_kernels_load_without_the_compilers_registries() -> None:
    """A process whose kernels are all in the disk cache loads them with numba's runtime alone: none is
    compiled and numba's typing and lowering registries stay unloaded (optimizer.jit)."""

    def run() -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", LOAD_SCRIPT],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parents[1],
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]

    run()  # fills the cache where this checkout's kernels were not compiled yet
    report = run()
    assert report["hits"] > 0 and report["misses"] == 0, report
    assert not report["registries"], report
