"""planning.allocator: the planner's processes keep freed memory; the switch that turns it off."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = (
    "from planning import allocator; print(allocator.in_force(), allocator.retain_freed_memory(), "
    "allocator.retain_freed_memory(), allocator.in_force())"
)


def _run(env: dict[str, str]) -> str:
    import os

    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env}, check=True
    )
    return proc.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_in_force_once_asked_and_idempotent() -> None:
    assert _run({"DHP_RETAIN_FREED_MEMORY": "1"}) == "False True True True"


def test_switched_off_by_the_environment() -> None:
    assert _run({"DHP_RETAIN_FREED_MEMORY": "0"}) == "False False False False"


def test_dhp_process_keeps_freed_memory() -> None:
    """``dhp`` run as the process's command puts the setting in force before its command runs."""
    code = (
        "import sys; from api.cli import main as m; from planning import allocator; "
        "sys.argv = ['dhp', 'presets']; rc = m.main(); print('IN_FORCE', allocator.in_force())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "IN_FORCE True" in proc.stdout, proc.stderr[-2000:]
