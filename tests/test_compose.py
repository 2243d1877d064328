"""Structure of the deployment files (no Docker engine runs here): compose services, health
checks, nginx, Dockerfile."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from api.service.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _workers(command: list[str]) -> int:
    return int(command[command.index("--workers") + 1]) if "--workers" in command else 1


def test_services_and_dependencies(compose):
    services = compose["services"]
    assert {"planner", "postgres", "nginx"} <= set(services)
    planner = services["planner"]
    assert planner["deploy"]["replicas"] * _workers(planner["command"]) >= 2
    assert planner["command"][:2] == ["dhp", "serve"]
    assert planner["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["nginx"]["depends_on"]["planner"]["condition"] == "service_healthy"
    assert "pgdata" in compose["volumes"]
    # Only the load balancer is published, and only on loopback.
    assert "ports" not in planner and "ports" not in services["postgres"]
    assert all(str(p).startswith("127.0.0.1:") for p in services["nginx"]["ports"])


def test_every_service_has_a_health_check(compose):
    for name, service in compose["services"].items():
        check = service.get("healthcheck")
        assert check and check["test"], name
    assert "/readyz" in " ".join(compose["services"]["planner"]["healthcheck"]["test"])
    assert "pg_isready" in " ".join(compose["services"]["postgres"]["healthcheck"]["test"])


def test_planner_settings_are_real_and_safe(compose):
    env = compose["services"]["planner"]["environment"]
    fields = set(Settings.model_fields)
    for key in env:
        if key.startswith("DHP_"):
            assert key[4:].lower() in fields, f"{key} is not a setting"
    assert env["DHP_ENVIRONMENT"] == "production"
    assert ":?" in env["DHP_TOKENS"]  # compose refuses to start without tokens
    pg = compose["services"]["postgres"]["environment"]
    url = env["DATABASE_URL"]
    assert (
        url.startswith("postgresql+psycopg://") and "@postgres:5432/" in url and url.endswith("/" + pg["POSTGRES_DB"])
    )
    # The settings accept this URL and refuse the same deployment without tokens.
    Settings(
        environment="production",
        host="0.0.0.0",
        tokens="t" * 32,
        database_url="postgresql+psycopg://dhp:dhp@postgres:5432/dhp",
    )
    with pytest.raises(ValueError):
        Settings(environment="production", host="0.0.0.0", tokens="")


def test_nginx_balances_over_the_planner(compose):
    nginx = compose["services"]["nginx"]
    mount = next(v for v in nginx["volumes"] if "nginx.conf" in v)
    src, dst = mount.split(":")[:2]
    conf = (ROOT / src).read_text()
    assert dst == "/etc/nginx/nginx.conf"
    port = compose["services"]["planner"]["command"][compose["services"]["planner"]["command"].index("--port") + 1]
    assert re.search(rf"upstream planner \{{[^}}]*server planner:{port}", conf)
    assert "proxy_pass http://planner;" in conf
    assert "http_503" in conf  # at capacity: try another replica
    assert conf.count("{") == conf.count("}")
    size = re.search(r"client_max_body_size (\d+)m;", conf)
    # Above the service's limit: the service answers a large body with its own 413 document;
    # beyond, nginx's is a problem document too.
    assert size and int(size.group(1)) * 1024 * 1024 > int(
        compose["services"]["planner"]["environment"]["DHP_MAX_BODY_BYTES"]
    )
    assert "error_page 413 @body_too_large;" in conf and "application/problem+json" in conf


def test_nginx_resolves_replicas_and_retries_only_what_is_safe_to_repeat(compose):
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    assert re.search(r"resolver 127\.0\.0\.11 valid=\d+s", conf)
    assert re.search(r"upstream planner \{[^}]*zone planner[^}]*server planner:\d+ resolve", conf)
    blocks = dict(re.findall(r"location (= /v1/plans|/) \{([^}]*)\}", conf))
    assert "non_idempotent" in blocks["= /v1/plans"]
    assert "proxy_next_upstream" in blocks["/"] and "non_idempotent" not in blocks["/"]
    assert conf.count("non_idempotent") == 1


def test_dockerfile(compose):
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert lines[0].startswith("FROM python:3.11")
    for line in lines:
        if line.startswith("COPY "):
            for src in shlex.split(line)[1:-1]:
                assert (ROOT / src).exists(), src
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert "EXPOSE 8000" in lines
    assert re.search(r"pip install -c constraints.txt '\.\[[^\]]*service[^\]]*\]'", text)
    assert lines[-1] == 'CMD ["dhp", "serve"]'
    # Kernels compiled at build time into a cache the non-root user owns.
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", text)
    assert cache and "warm_up()" in text and f"chown -R dhp {cache.group(1)}" in text
    assert compose["services"]["planner"]["build"] == "."


def test_the_image_holds_every_package_the_service_imports():
    """The service's app, the warm-up the build runs and the epoch jobs it plans import only packages the
    Dockerfile copies into the image (a package left out fails the build's warm-up or a job)."""
    script = (
        "import json, sys\n"
        "import api.app, planning.planner, jobs.spec, jobs.steps, jobs.engines\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    local = {name for name in json.loads(out.stdout) if (ROOT / name / "__init__.py").exists()}
    text = (ROOT / "Dockerfile").read_text()
    copied = set(re.findall(r"^COPY (\w+) \./\1$", text, flags=re.M))
    assert local and local <= copied, f"imported but not copied into the image: {sorted(local - copied)}"
