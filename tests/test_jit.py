"""The compiled loops and their plain-Python form (numba absent or NUMBA_DISABLE_JIT=1) give the same plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _report(script: str, env: dict[str, str] | None = None, timeout: int = 300) -> Any:
    """What ``script``, run in a fresh interpreter at the repository's root, printed last (as JSON)."""
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[1],
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run(disable: bool) -> list:
    return _report(SCRIPT, env={**os.environ, "NUMBA_DISABLE_JIT": "1" if disable else "0"})  # type: ignore[no-any-return]


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
    first, second, error = _report(script)
    assert first > 0 and second == 0 and error is None


def test_kernels_compile_without_a_writable_cache() -> None:
    if not jit.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    calls = []

    def fake_njit(**options):
        calls.append(options)
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'f.py'")
        return lambda fn: ("compiled", fn)

    def f(x):
        return x

    assert jit._njit_of(f, fake_njit) == ("compiled", f)
    assert [c.get("cache", False) for c in calls] == [True, False]


def test_a_kernel_runs_python_until_loaded_and_compiled_after() -> None:
    """In a fresh process, planning a small batch with ``warm=False`` (as ``dhp plan`` does) imports no
    numba; :func:`optimizer.jit.load` then switches every kernel, and a kernel calling another compiles."""
    script = (
        "import json, sys, numpy as np\n"
        "from optimizer import jit\n"
        "from optimizer.costs import time_kernels as t\n"
        "from optimizer.problem.documents import problem_from_json\n"
        "from optimizer.problem.workloads import long_tail_video\n"
        "from planning.planner import plan\n"
        "doc = {'batch': long_tail_video(64, seed=1), 'cluster_preset': 'h100-8x8', 'model_preset': 'qwen2-vl-7b',"
        " 'options': {'backend': 'heuristic', 'time_budget_ms': 150}}\n"
        "before = plan(problem_from_json(doc), warm=False).predicted_step_time_s\n"
        "python = 'numba' in sys.modules\n"
        "compiled = jit.load()\n"
        "out = np.zeros((2, 3))\n"
        "t.fill_best_time(np.ones((2, 3)), np.full((2, 3), 2.0), np.array([True, False, True]), out)\n"
        "print(json.dumps({'numba_before': python, 'compiled': compiled, 'loaded': jit.loaded(), 'out': out.tolist(),"
        " 'form': repr(t.fill_best_time), 'step': before}))\n"
    )
    report = _report(script)
    assert report["numba_before"] is False
    assert report["step"] > 0
    assert report["out"] == [[1.0, 2.0, 1.0], [1.0, 2.0, 1.0]]
    if jit.HAVE_NUMBA:
        assert report["compiled"] and report["loaded"] and "(compiled)" in report["form"]


LOAD_SCRIPT = """
import importlib, json, pkgutil
import optimizer
from numba.core.imputils import builtin_registry
from numba.core.registry import cpu_target
from optimizer.jit import Kernel
from planning.planner import warm_up
warm_up()
mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(optimizer.__path__, "optimizer.")]
kernels = [v.dispatcher for m in mods for v in vars(m).values() if isinstance(v, Kernel)]
print(json.dumps({"hits": sum(sum(k._cache_hits.values()) for k in kernels),
                  "misses": sum(sum(k._cache_misses.values()) for k in kernels),
                  "registries": builtin_registry in cpu_target.target_context._registries}))
"""


@pytest.mark.skipif(not jit.HAVE_NUMBA, reason="numba is not installed")
def test_cached_kernels_load_without_the_compilers_registries() -> None:
    """A process whose kernels are all in the disk cache loads them with numba's runtime alone: none is
    compiled and numba's typing and lowering registries stay unloaded (optimizer.jit)."""

    def run() -> dict:
        return _report(LOAD_SCRIPT, timeout=600)  # type: ignore[no-any-return]

    run()  # fills the cache where this checkout's kernels were not compiled yet
    report = run()
    assert report["hits"] > 0 and report["misses"] == 0, report
    assert not report["registries"], report


@pytest.mark.parametrize("pad_unit", [0, 2])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("speed", [1.0, 0.6])
def test_the_time_matrix_numpy_form_gives_the_loops_bits(pad_unit: int, overlap: bool, speed: float) -> None:
    """The numpy form that runs before numba loads (optimizer.jit) and the loop numba compiles agree to the last
    bit, with and without padding, overlap, a slower GPU and a hybrid group's all-to-all."""
    import numpy as np

    from optimizer.costs import time_kernels

    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 200_000, size=40)
    vision = rng.random(40) * 1e-3
    degrees = np.array([1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0])
    share, a2a = rng.random(8), rng.random(8) * 0.5
    bandwidth, latency = rng.random(8) * 1e11 + 1e9, rng.random(8) * 1e-4
    intra_bandwidth, intra_latency = bandwidth * 4.0, latency * 0.5
    args = (
        lengths,
        vision,
        degrees,
        share,
        a2a,
        bandwidth,
        latency,
        intra_bandwidth,
        intra_latency,
        5e-11,
        2e-7,
        1e-4,
        4096.0,
        2048.0,
        speed,
        overlap,
        3e-5,
        pad_unit,
    )
    kernel = time_kernels.fill_time_matrices
    forms = [kernel.python, kernel.py_func]
    if jit.HAVE_NUMBA:
        forms.append(kernel.dispatcher)
    outs = []
    for form in forms:
        out, intra_out = np.empty((40, 8)), np.empty((40, 8))
        form(*args, out, intra_out)
        outs.append((out, intra_out))
    for out, intra_out in outs[1:]:
        assert np.array_equal(out, outs[0][0])
        assert np.array_equal(intra_out, outs[0][1])
    assert not np.array_equal(outs[0][0][:, 1:], outs[0][1][:, 1:])  # the links differ
    assert np.array_equal(outs[0][0][:, 0], outs[0][1][:, 0])  # a group of one sends nothing


def test_the_python_forms_serve_small_short_clock_bound_plans_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from optimizer.problem.documents import problem_from_json
    from optimizer.problem.workloads import long_tail_video
    from planning.kernel_choice import ENV, wants_compiled

    monkeypatch.delenv(ENV, raising=False)
    doc = {"batch": long_tail_video(64, seed=1), "cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b"}
    small = problem_from_json({**doc, "options": {"time_budget_ms": 200}})
    assert not wants_compiled(small)
    assert wants_compiled(replace(small, options=replace(small.options, time_budget_ms=5000)))
    assert wants_compiled(replace(small, options=replace(small.options, deterministic=True)))
    big = problem_from_json(
        {
            **doc,
            "batch": long_tail_video(2048, seed=1),
            "cluster_preset": "h100-32x8",
            "options": {"time_budget_ms": 200},
        }
    )
    assert wants_compiled(big)
    monkeypatch.setenv(ENV, "compiled")
    assert wants_compiled(small)
    monkeypatch.setenv(ENV, "python")
    assert not wants_compiled(big)


def test_a_numba_that_will_not_import_leaves_the_python_forms() -> None:
    script = (
        "import importlib.abc, json, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'numba':\n"
        "            raise ImportError('numba is broken here')\n"
        "from optimizer import jit\n"
        "sys.meta_path.insert(0, Block())\n"
        "from optimizer.costs import time_kernels as t\n"
        "import numpy as np\n"
        "compiled = jit.load()\n"
        "out = np.zeros((1, 1))\n"
        "t.fill_best_time(np.ones((1, 1)), np.ones((1, 1)), np.array([True]), out)\n"
        "print(json.dumps({'compiled': compiled, 'error': jit.load_error, 'out': out.tolist()}))\n"
    )
    report = _report(script, timeout=120)
    assert report["out"] == [[1.0]] and report["compiled"] is False
    if jit.HAVE_NUMBA:
        assert "numba is broken here" in report["error"]


def test_the_column_gather_forms_agree() -> None:
    import numpy as np

    from optimizer.costs.time_kernels import gather_columns

    matrix = np.random.default_rng(4).random((50, 12))
    columns = np.array([3, 0, 11, 3, 7], dtype=np.int64)
    forms = [gather_columns.python, gather_columns.py_func]
    if jit.HAVE_NUMBA:
        forms.append(gather_columns.dispatcher)
    for form in forms:
        out = np.empty((50, 5))
        form(matrix, columns, out)
        assert np.array_equal(out, matrix[:, columns])
