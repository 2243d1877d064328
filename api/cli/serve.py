"""``dhp serve``: run the planning service with uvicorn.

Imports nothing from the web stack until the command runs, so ``dhp`` works without the
``service`` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run the planning service over HTTP (see /docs once it runs)")
    p.add_argument("--host", help="address to bind (default DHP_HOST or 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default DHP_PORT or 8000)")
    p.add_argument("--workers", type=int, help="server processes (default DHP_WORKERS or 1)")
    p.add_argument(
        "--data-dir", help="directory of the SQLite store (default DHP_DATA_DIR or ./data); ignored with DATABASE_URL"
    )
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)


def load_settings(overrides: dict[str, Any]) -> Any:
    """Settings from the environment with the command-line values on top; bad values become a ProblemError."""
    from pydantic import ValidationError

    from api.service.settings import Settings
    from optimizer.errors import ProblemError

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})  # the rest from the environment
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err.get("loc", ())) or "settings"
        raise ProblemError(
            err.get("msg", "invalid setting"),
            field=f"DHP_{field.upper()}" if field != "settings" else field,
            hint="fix the environment variable or the dhp serve option.",
        ) from None


def exposure_warning(settings: Any) -> str | None:
    """A warning when the service would answer anyone who can reach it: beyond loopback without tokens
    (allowed in development; test and production refuse to start so)."""
    from api.service.settings import is_loopback

    if settings.token_list or is_loopback(settings.host):
        return None
    return (
        f"warning: listening on {settings.host} without bearer tokens: anyone who can reach this port can plan and "
        "read plans; set DHP_TOKENS (e.g. `openssl rand -hex 24`) or bind to 127.0.0.1"
    )


def example_curl(base: str, needs_token: bool) -> str:
    """A curl command that plans a small batch on this server."""
    body = {
        "batch": {
            "samples": [
                {"id": "long-video", "text_tokens": 400, "videos": [{"frames": 600, "tokens_per_frame": 196}]},
                {"id": "caption", "text_tokens": 90, "images": [{"tokens": 576}]},
                {"id": "doc", "text_tokens": 24000},
            ]
        },
        "cluster_preset": "h100-8x8",
        "model_preset": "qwen2-vl-7b",
        "options": {"time_budget_ms": 200},
    }
    auth = "-H 'Authorization: Bearer $DHP_TOKEN' " if needs_token else ""
    return (
        f"curl -s -X POST {base}/v1/plans {auth}-H 'content-type: application/json' -d {shlex.quote(json.dumps(body))}"
    )


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.service.http_protocol import ProblemHTTPProtocol
    from api.store import Store
    from api.store.migrate import upgrade

    overrides = {"host": args.host, "port": args.port, "workers": args.workers, "data_dir": args.data_dir}
    settings = load_settings(overrides)
    # Worker processes build their settings from the environment: hand the command-line values on.
    for key, value in overrides.items():
        if value is not None:
            os.environ[f"DHP_{key.upper()}"] = str(value)
    if not settings.database_url:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    # Migrate once here, so that worker processes start on an up-to-date schema.
    store = Store(settings.sqlalchemy_url)
    upgrade(store.engine)
    store.close()
    if settings.workers > 1:
        metrics_dir = Path(settings.data_dir) / f"metrics-{os.getpid()}"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir.resolve())
    warning = exposure_warning(settings)
    if warning:
        print(warning, file=sys.stderr)
    base = f"http://{settings.host}:{settings.port}"
    where = (
        "PostgreSQL"
        if settings.sqlalchemy_url.startswith("postgresql")
        else f"SQLite at {settings.sqlalchemy_url.removeprefix('sqlite:///')}"
    )
    print(f"dhp-planner service on {base} ({settings.workers} worker(s), store: {where})", file=sys.stderr)
    print(f"  dashboard: {base}/dashboard   API docs: {base}/docs", file=sys.stderr)
    print(f"  health:    {base}/healthz   metrics: {base}/metrics", file=sys.stderr)
    print(f"  try:       {example_curl(base, bool(settings.token_list))}", file=sys.stderr)
    # Malformed HTTP, refused by the parser before the app, is answered with a problem document too.
    uvicorn.run(
        "api.app:create_app",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_level=args.log_level,
        access_log=False,
        http=ProblemHTTPProtocol,
    )
    return 0
