"""The warm-up loads every compiled kernel the planning path uses: after it, planning varied
problems (ring and Ulysses, one GPU type and mixed, memory-bound, measured profiles) loads none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import importlib, json, pkgutil, sys
sys.path.insert(0, "tests")
import optimizer
from optimizer.jit import Kernel
from planning.planner import warm_up
import planning.warm as warm
from optimizer.problem.documents import problem_from_json
from optimizer.errors import PlannerError
from planning.planner import plan
from optimizer.problem.workloads import long_tail_video
from oracle_instances import instance, with_options

mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(optimizer.__path__, "optimizer.")]
kernels = {f"{m.__name__}.{k}": v.dispatcher for m in mods for k, v in vars(m).items()
           if isinstance(v, Kernel) and v.py_func.__module__ == m.__name__}
warm_up()
before = {k: len(v.signatures) for k, v in kernels.items()}
docs = [with_options(instance(seed)[0], backend="heuristic") for seed in range(40)]
docs.append({"cluster_preset": "h100-8x8", "model_preset": "qwen2-vl-7b", "batch": long_tail_video(300, seed=1),
             "options": {"backend": "heuristic"}})
docs.append({"cluster_preset": "mixed-h100-a100", "model_preset": "qwen2-vl-7b", "batch": long_tail_video(200, seed=2),
             "options": {"backend": "heuristic", "cp_scheme": "ulysses"}})
for doc in docs:
    try:
        plan(problem_from_json(doc))
    except PlannerError:
        pass
after = {k: len(v.signatures) for k, v in kernels.items()}
print(json.dumps({"error": warm.last_error, "loaded_later": sorted(k for k in kernels if after[k] != before[k])}))
"""


def test_no_kernel_loads_after_the_warm_up():
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=ROOT, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["error"] is None, report["error"]
    assert report["loaded_later"] == [], f"kernels first loaded after the warm-up: {report['loaded_later']}"


PAUSE_SCRIPT = r"""
import json, threading, time
import planning.warm as w

done = []
first = threading.Event()
release = threading.Event()

def fake(problem):
    done.append(1)
    if len(done) == 1:
        first.set()
        release.wait(30)

warming = threading.Thread(target=w.warm_up_with, args=(fake,))
warming.start()
first.wait(30)

def let_go():  # the first request ends only once the timed plan below waits for it
    while w._waiting == 0:
        time.sleep(0.001)
    release.set()

threading.Thread(target=let_go).start()
with w.warmed(fake):
    inside = (len(done), w.ended())
warming.join(60)
print(json.dumps({"inside": inside, "ended": w.ended(), "requests": len(done),
                  "expected": len(w.warm_up_requests())}))
"""


def test_a_timed_plan_pauses_another_threads_warm_up():
    """A plan asked for while another thread warms up waits for that thread's current request only;
    the warm-up then runs its other requests to the end."""
    out = subprocess.run(
        [sys.executable, "-c", PAUSE_SCRIPT], capture_output=True, text=True, timeout=300, cwd=ROOT, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["inside"] == [1, False]
    assert report["ended"] is True
    assert report["requests"] == report["expected"]


def test_the_first_plan_of_a_process_warms_it_up():
    """``plan()`` with nothing warmed runs the whole warm-up in its thread before its clock starts."""
    code = (
        "import json, planning.warm as w; from planning.planner import plan; "
        "from optimizer.problem.documents import problem_from_json; "
        "before = w.ended(); plan(problem_from_json({'cluster_preset': 'h100-1x8', 'model_preset': 'llama3-8b', "
        "'batch': {'samples': [{'id': 'a', 'text_tokens': 900}]}})); print(json.dumps([before, w.ended()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True]
