"""The tree's layout rules that the import graph does not cover: one name per module, argument
parsing only at the top, the client installable alone, and commit subjects that fit a log line."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import import_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

LIBRARY_PARTS = (
    "optimizer",
    "solver_models",
    "planning",
    "api.store",
    "api.client",
    "api.service",
    "api.dashboard",
    "api",
)
"""Parts that other code imports as a library: they never parse a command line."""

SUBJECTS_SINCE = "0ab1652b9d3912faf5823733823f2d3e5107da1f"
"""The first commit held to the 72-character subject rule (the tree's formatting commit)."""


def test_no_two_modules_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for module in import_graph.modules():
        if not module.endswith("__init__") and "." in module:
            by_name[module.rpartition(".")[2]].append(module)
    for path in (ROOT / "scripts").glob("*.py"):
        by_name[path.stem].append(f"scripts.{path.stem}")
    packages = {m for m in import_graph.modules() if (ROOT / m.replace(".", "/") / "__init__.py").exists()}
    shared = {name: mods for name, mods in by_name.items() if len([m for m in mods if m not in packages]) > 1}
    assert shared == {}, f"module names used more than once: {shared}"


def test_argument_parsing_lives_in_the_command_line_and_in_script_entry_points():
    offenders = []
    for module, path in import_graph.modules().items():
        text = path.read_text()
        if not re.search(r"^\s*(import argparse|from argparse )", text, re.M):
            continue
        part = import_graph.part(module)
        if part == "api.cli":
            continue
        if part in LIBRARY_PARTS or '__name__ == "__main__"' not in text:
            offenders.append(module)
    assert offenders == [], f"argparse outside api/cli and script entry points: {offenders}"


def test_script_entry_points_are_imported_only_by_the_command_line_and_other_scripts():
    known = import_graph.modules()
    graph = import_graph.imports(known)
    scripts = {m for m, p in known.items() if '__name__ == "__main__"' in p.read_text()}
    wrong = sorted(
        f"{user} -> {script}"
        for user, deps in graph.items()
        for script in deps & scripts
        if import_graph.part(user) in LIBRARY_PARTS
    )
    assert wrong == []


def test_the_client_extra_is_httpx_alone_and_the_client_imports_without_the_engine_or_the_web_stack():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == []
    assert [re.split(r"[<>=\[;]", d)[0] for d in project["optional-dependencies"]["client"]] == ["httpx"]
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        BLOCKED = ("numpy", "numba", "fastapi", "pydantic", "sqlalchemy", "starlette", "torch")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        import httpx
        from api.client import PlannerClient, ServiceUnavailable
        def answer(request):
            return httpx.Response(201, json={"id": "p1", "status": "done", "step_time_s": 1.0})
        client = PlannerClient("http://planner", transport=httpx.MockTransport(answer), retries=0)
        print(client.plan(batch={"samples": [{"id": "a", "text_tokens": 8}]})["id"])
        def down(request):
            raise httpx.ConnectError("refused", request=request)
        fallback = PlannerClient("http://planner", transport=httpx.MockTransport(down), retries=0, local_fallback=True)
        try:
            fallback.plan(batch={"samples": [{"id": "a", "text_tokens": 8}]})
        except ModuleNotFoundError as exc:
            print(exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.strip().splitlines()
    assert first == "p1"
    assert "needs the engine" in second and "pip install 'dhp-planner[engine]'" in second


def test_commit_subjects_fit_72_characters():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    known = subprocess.run(["git", "cat-file", "-e", SUBJECTS_SINCE], cwd=ROOT, capture_output=True)
    if known.returncode != 0:
        pytest.skip("a shallow clone without the first commit held to the rule")
    log = subprocess.run(
        ["git", "log", "--format=%h %s", f"{SUBJECTS_SINCE}^..HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    long = [line for line in log.stdout.splitlines() if len(line.split(" ", 1)[1]) > 72]
    assert long == [], "commit subjects over 72 characters:\n" + "\n".join(long)


def test_the_command_line_without_the_engine_names_the_extra_to_install():
    script = textwrap.dedent(
        """
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("numpy", "numba"):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        sys.meta_path.insert(0, Block())
        from api.cli.main import main
        sys.exit(main(["plan", "--batch", "examples/batch_small.json"]))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "error: this command needs numpy, which is not installed. To fix: pip install 'dhp-planner[engine]'."
    ]
