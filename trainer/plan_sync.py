"""One plan on every rank: broadcast from rank 0 and a digest every rank checks.

Rank 0 obtains the plan (from the planning service or in process) and broadcasts the document;
every rank then computes :func:`plan_digest` of what it received and the digests are gathered and
compared, so a rank that would run a different plan (a corrupted transfer, a rank that planned on
its own) stops the step with :class:`PlanMismatch` before any collective of the step is posted.

The digest covers what decides a rank's work: the scheme, the domain size and, per micro-batch and
group, the ranks, the samples and their lengths (SHA-256 of their canonical JSON).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist


class PlanMismatch(RuntimeError):
    """Ranks hold different plans."""


def plan_digest(doc: Mapping[str, Any]) -> str:
    """SHA-256 of the parts of a plan document that decide the work (see the module docstring)."""
    mbs = [
        [
            {
                "ranks": list(g.get("ranks", ())),
                "samples": list(g.get("samples", ())),
                "lengths": [int(x) for x in (g.get("lengths") or [s.get("length") for s in g.get("shards", ())])],
            }
            for g in mb.get("groups", ())
        ]
        for mb in doc.get("micro_batches", ())
    ]
    canonical = {"scheme": doc.get("scheme", "ring"), "domain_size": doc.get("domain_size"), "micro_batches": mbs}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_digest(doc: Mapping[str, Any], group: Any = None) -> str:
    """Gather every rank's digest of ``doc`` and raise :class:`PlanMismatch` unless all are equal (collective)."""
    mine = plan_digest(doc)
    digests: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(digests, mine, group=group)
    if len(set(digests)) != 1:
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        raise PlanMismatch(
            f"ranks hold different plans: digest {digests[0][:12]} on rank 0, other digests on ranks {odd} "
            f"({', '.join(str(digests[r])[:12] for r in odd)})"
        )
    return mine


def broadcast_plan(doc: Mapping[str, Any] | None, src: int = 0, group: Any = None) -> tuple[dict[str, Any], str]:
    """Rank ``src`` passes the plan, the others None; every rank returns (the plan, its checked digest). Collective."""
    box: list[Any] = [dict(doc) if doc is not None else None]
    dist.broadcast_object_list(box, src=src, group=group)
    if not isinstance(box[0], dict):
        raise PlanMismatch(f"rank {src} broadcast no plan")
    return box[0], check_digest(box[0], group)
