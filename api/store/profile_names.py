"""The name the dashboard shows for a plan's cost profile.

A stored plan knows its profile by its label (:func:`api.store.repository.request_columns`): ``analytical`` when
the request gave none, else the profile document's ``source`` text (``given`` without one). A profile document
has no name member, and a preset profile (``dhp plan --profile-preset``, the zoo of
:mod:`optimizer.costs.zoo`) reaches the request as its document; so a label that is a zoo profile's source is
shown as that preset's name, and any other as a short form of its source.
"""

from __future__ import annotations

from functools import lru_cache

from api.store.repository import request_columns
from optimizer.costs.zoo import load_profile, profile_names

SHORT_NAME = 32
"""Characters of a source text shown as a profile's name (with an ellipsis when cut)."""


@lru_cache(maxsize=1)
def zoo_labels() -> dict[str, str]:
    """The store's label of each zoo profile, mapped to the profile's preset name."""
    out: dict[str, str] = {}
    for name in profile_names():
        out.setdefault(request_columns({"profile": load_profile(name)})["profile"], name)
    return out


def short_source(source: str) -> str:
    """A source text up to its first parenthesis or semicolon, at most :data:`SHORT_NAME` characters."""
    head = source
    for stop in (" (", "(", ";"):
        head = head.split(stop, 1)[0]
    head = head.strip() or source.strip()
    return head if len(head) <= SHORT_NAME else head[: SHORT_NAME - 1].rstrip() + "\u2026"


def profile_name(label: str | None) -> str:
    """``analytical`` for no profile, the zoo preset's name for a zoo profile's label, else its short source."""
    if not label or label == "analytical":
        return "analytical"
    return zoo_labels().get(label) or short_source(label)
