"""Service settings, read from the environment with the prefix ``DHP_`` (pydantic-settings).

Outside development (``test`` and ``production``) the settings refuse unsafe combinations: a
service that listens on anything but loopback must have bearer tokens, and tokens must be long
enough to resist guessing.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_LENGTH = 16


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """Everything an operator may set. Each field is ``DHP_<NAME>`` in the environment."""

    model_config = SettingsConfigDict(env_prefix="DHP_", extra="ignore", frozen=True)

    environment: Literal["development", "test", "production"] = "development"
    """``test`` and ``production`` turn on the safety checks below."""
    host: str = "127.0.0.1"
    """Address the server binds to (``dhp serve --host``); used for the safety checks."""
    port: int = Field(8000, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    """Server processes (``dhp serve --workers``)."""
    data_dir: Path = Path("data")
    """Where the embedded SQLite database (and multiprocess metrics) live."""
    database_url: str | None = Field(None, validation_alias=AliasChoices("DHP_DATABASE_URL", "DATABASE_URL"))
    """SQLAlchemy URL, e.g. ``postgresql+psycopg://user:pw@host/db``; None means SQLite under data_dir."""
    tokens: str = ""
    """Comma-separated bearer tokens; when any is set, every /v1 call needs one."""
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Largest request body; larger ones get 413."""
    max_body_bytes_in_flight: int = Field(32 * 1024 * 1024, ge=1024)
    """Request bodies held at once in one process (from the first byte read until the answer); beyond
    it 503 with Retry-After."""
    body_timeout_s: float = Field(10.0, gt=0.0, le=600.0)
    """Time from a request's arrival within which its whole body must arrive; a slower one gets 408."""
    max_samples: int = Field(65_536, ge=1)
    max_ranks: int = Field(16_384, ge=1)
    max_budget_ms: float = Field(60_000.0, ge=1.0)
    """Largest ``options.time_budget_ms`` a request may ask for."""
    solve_workers: int = Field(2, ge=1, le=256)
    """Solves that run at once in one server process (threads off the event loop)."""
    queue_limit: int = Field(4, ge=0, le=10_000)
    """Solves that may wait for a free worker; beyond running + waiting the answer is 503."""
    solve_nice: int = Field(0, ge=0, le=19)
    """How far below the event loop's CPU priority (Linux ``nice``) the solve threads run. 0 (the default)
    keeps them level with the rest of the machine: lowered, they starve behind every other busy process and
    overrun their budgets."""
    solver_threads: int = Field(1, ge=1, le=64)
    """Cap on ``options.solver_workers`` (threads one exact solve may use)."""
    retry_after_s: int = Field(1, ge=1, le=3600)
    """Retry-After seconds sent with a 503."""
    plan_cache_size: int = Field(256, ge=0)
    """Plans per process kept in memory by request hash (the store is the lasting cache)."""
    long_poll_max_ms: int = Field(30_000, ge=0)
    refit_every: int = Field(0, ge=0, le=100_000)
    """Automatic refit: every this many steps of feedback with group times for one cluster, model and profile,
    when their median step error is above ``refit_error``, refit the profile over the newest
    ``max(refit_every, 50)`` of them and store it (``learned:KEY`` names the newest); 0 (the default): off.
    Each decision is logged."""
    refit_error: float = Field(0.10, gt=0.0, le=10.0)
    """Median |measured / predicted - 1| of those steps above which the automatic refit runs."""
    store_retry_s: float = Field(30.0, ge=0.0, le=3600.0)
    """How long a plan-ahead answer is retried while the store does not answer, before it is left pending for a
    later start to resume."""

    @property
    def stale_after_s(self) -> float:
        """A plan-ahead request still pending after this long was lost (its server stopped): every
        admitted solve starts after at most queue_limit / solve_workers others and ends within its budget."""
        rounds = 1 + -(-self.queue_limit // self.solve_workers)
        return rounds * self.max_budget_ms / 1000.0 + 60.0

    @property
    def token_list(self) -> list[str]:
        return [t.strip() for t in self.tokens.split(",") if t.strip()]

    @property
    def sqlalchemy_url(self) -> str:
        if self.database_url:
            url = self.database_url
            # Plain postgres URLs (as most platforms hand them out) use the installed psycopg 3 driver.
            for prefix in ("postgres://", "postgresql://"):
                if url.startswith(prefix):
                    return "postgresql+psycopg://" + url[len(prefix) :]
            return url
        return f"sqlite:///{(self.data_dir / 'dhp.sqlite3').resolve()}"

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if self.environment == "development":
            return self
        problems = []
        tokens = self.token_list
        if not tokens and not is_loopback(self.host):
            problems.append(
                f"DHP_TOKENS is empty but DHP_HOST={self.host!r} is reachable from other machines: "
                "set DHP_TOKENS or bind to 127.0.0.1"
            )
        short = [t for t in tokens if len(t) < MIN_TOKEN_LENGTH]
        if short:
            problems.append(
                f"{len(short)} token(s) in DHP_TOKENS are shorter than {MIN_TOKEN_LENGTH} characters: "
                "use random tokens (e.g. `openssl rand -hex 24`)"
            )
        if problems:
            raise ValueError(f"unsafe {self.environment} settings: " + "; ".join(problems))
        return self
