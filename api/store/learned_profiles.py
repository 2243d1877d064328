"""Learned profiles in the plan store, and the measured steps they are fitted to.

A learned profile is named ``KEY.vN``: ``KEY`` says which cluster, model and profile the first plans of its
line were made with, ``N`` counts the refits of that key. A request names one as ``"profile":
"learned:KEY.vN"``, or the newest of a key as ``"profile": "learned:KEY"``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from api.store.models import PLANS, FeedbackRow, ProfileRow
from api.store.repository import Store, _aware, is_id, utcnow

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,159}$")
"""What a learned profile's name (and so its key) may look like."""
VERSION = re.compile(r"^(?P<key>.+)\.v(?P<version>[0-9]{1,9})$")
PREFIX = "learned:"
GROUP_TIMES = '%"group_times_s": [%'
"""A stored feedback document (``json.dumps`` of what was sent) that carries group times."""


@dataclass(frozen=True)
class MeasuredStep:
    """One feedback with group times and the plan it measured (with its documents)."""

    plan_id: str
    feedback_id: int
    request_json: str
    plan_json: str
    group_times_s: list[list[float]]
    measured_step_time_s: float
    predicted_step_time_s: float | None
    cluster: str | None
    model: str | None
    profile: str
    n_ranks: int


@dataclass(frozen=True)
class LearnedProfile:
    name: str
    key: str
    version: int
    created_at: datetime
    cluster: str | None
    model: str | None
    base_profile: str
    profile: dict[str, Any]
    fit: dict[str, Any]
    sources: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reference": PREFIX + self.name,
            "key": self.key,
            "version": self.version,
            "created_at": self.created_at.isoformat(),
            "cluster": self.cluster,
            "model": self.model,
            "base_profile": self.base_profile,
            "profile": self.profile,
            "fit": self.fit,
            "sources": self.sources,
        }


def key_part(text: str) -> str:
    """A name's part made of the characters :data:`NAME` allows (others become ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "x"


def _learned(row: ProfileRow) -> LearnedProfile:
    return LearnedProfile(
        row.name,
        row.key,
        row.version,
        _aware(row.created_at),
        row.cluster,
        row.model,
        row.base_profile,
        json.loads(row.profile_json),
        json.loads(row.fit_json),
        json.loads(row.sources_json),
    )


def measured_steps(
    store: Store,
    *,
    plan_ids: Sequence[str] | None = None,
    cluster: str | None = None,
    model: str | None = None,
    profile: str | None = None,
    labels: Sequence[str] | None = None,
    n_ranks: int | None = None,
    latest: int | None = None,
) -> list[MeasuredStep]:
    """Feedback that carries group times, oldest first: of the plans named, or the ``latest`` of the plans of a
    cluster, model, profile label (or any of ``labels``) and rank count (each filter applied when given)."""
    cond = _selection(cluster, model, profile)
    if plan_ids is not None:
        cond.append(PLANS.c.id.in_([p for p in plan_ids if is_id(p)]))
    if labels is not None:
        cond.append(func.coalesce(PLANS.c.profile, "analytical").in_(list(labels)))
    if n_ranks is not None:
        cond.append(PLANS.c.n_ranks == n_ranks)
    query = (
        select(
            FeedbackRow.id,
            FeedbackRow.plan_id,
            FeedbackRow.feedback_json,
            FeedbackRow.measured_step_time_s,
            FeedbackRow.predicted_step_time_s,
            PLANS.c.request_json,
            PLANS.c.plan_json,
            PLANS.c.cluster,
            PLANS.c.model,
            PLANS.c.profile,
            PLANS.c.n_ranks,
        )
        .join(PLANS, PLANS.c.id == FeedbackRow.plan_id)
        .where(*cond)
        .order_by(FeedbackRow.id.desc())
    )
    if latest is not None:
        query = query.limit(latest)
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    out = []
    for fid, pid, fb, measured, predicted, request_json, plan_json, c, m, p, ranks in reversed(rows):
        times = json.loads(fb).get("group_times_s")
        if times:
            out.append(
                MeasuredStep(
                    pid, fid, request_json, plan_json, times, measured, predicted, c, m, p or "analytical", ranks
                )
            )
    return out


def step_labels(store: Store, cluster: str | None, model: str | None) -> list[str]:
    """The profile labels of a cluster and model's plans that have feedback with group times."""
    query = (
        select(func.coalesce(PLANS.c.profile, "analytical"))
        .join(FeedbackRow, PLANS.c.id == FeedbackRow.plan_id)
        .where(*_selection(cluster, model, None))
        .distinct()
    )
    with store.engine.connect() as conn:
        return [label for (label,) in conn.execute(query)]


def _selection(cluster: str | None, model: str | None, profile: str | None) -> list[Any]:
    cond = [PLANS.c.status == "done", FeedbackRow.feedback_json.like(GROUP_TIMES)]
    if cluster is not None:
        cond.append(PLANS.c.cluster == cluster)
    if model is not None:
        cond.append(PLANS.c.model == model)
    if profile is not None:
        cond.append(func.coalesce(PLANS.c.profile, "analytical") == profile)
    return cond


def step_count(store: Store, cluster: str | None, model: str | None, profile: str) -> int:
    """How many feedback documents with group times the plans of this cluster, model and profile label have."""
    query = (
        select(func.count(FeedbackRow.id))
        .join(PLANS, PLANS.c.id == FeedbackRow.plan_id)
        .where(*_selection(cluster, model, profile))
    )
    with store.engine.connect() as conn:
        return int(conn.execute(query).scalar() or 0)


def add_profile(
    store: Store,
    key: str,
    *,
    cluster: str | None,
    model: str | None,
    base_profile: str,
    profile: Callable[[str], dict[str, Any]],
    fit: dict[str, Any],
    sources: dict[str, Any],
) -> LearnedProfile:
    """Store the next version of ``key``; ``profile(name)`` gives the profile document for its name."""
    for _ in range(5):
        try:
            with store._session.begin() as s:
                last = s.scalar(select(func.max(ProfileRow.version)).where(ProfileRow.key == key)) or 0
                name = f"{key}.v{last + 1}"
                row = ProfileRow(
                    name=name,
                    key=key,
                    version=last + 1,
                    created_at=utcnow(),
                    cluster=cluster,
                    model=model,
                    base_profile=base_profile,
                    profile_json=json.dumps(profile(name)),
                    fit_json=json.dumps(fit),
                    sources_json=json.dumps(sources),
                )
                s.add(row)
                s.flush()
                return _learned(row)
        except IntegrityError:  # another refit of the key took this version meanwhile
            continue
    raise RuntimeError(f"could not store a new version of {key!r}")


def get_profile(store: Store, name: str) -> LearnedProfile | None:
    """The profile named ``KEY.vN``, or the newest of ``KEY``; None when there is none."""
    with store._session() as s:
        row = s.scalars(select(ProfileRow).where(ProfileRow.name == name)).first()
        if row is None:
            row = s.scalars(
                select(ProfileRow).where(ProfileRow.key == name).order_by(ProfileRow.version.desc())
            ).first()
        return None if row is None else _learned(row)


def list_profiles(store: Store, key: str | None = None, limit: int = 200) -> list[LearnedProfile]:
    """Learned profiles, newest first (of one key when given)."""
    query = select(ProfileRow).order_by(ProfileRow.id.desc()).limit(limit)
    if key is not None:
        query = query.where(ProfileRow.key == key)
    with store._session() as s:
        return [_learned(r) for r in s.scalars(query).all()]
