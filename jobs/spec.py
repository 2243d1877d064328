"""The job document: what to plan (dataset or batches, sampler, global batch size) and how (a plan
request without its batch). The same document is the body of ``POST /v1/jobs``; ``dhp plan-epoch``
builds it from its flags. Errors name the field and say how to fix it.

```json
{"dataset": {"path": "samples.jsonl"} | {"samples": [...]},   // or "batches": [{"samples": [...]}, ...]
 "global_batch_size": 512,
 "sampler": {"kind": "shuffle", "seed": 0, "epoch": 0, "group_batches": 16},
 "drop_last": false, "max_steps": null,
 "cluster" | "cluster_preset", "model" | "model_preset", "profile", "options", "existing_groups"}
```
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from optimizer.errors import ProblemError

SAMPLERS = ("sequential", "shuffle", "length-grouped")
TEMPLATE_KEYS = ("cluster", "cluster_preset", "model", "model_preset", "profile", "options", "existing_groups")
JOB_KEYS = {"dataset", "batches", "global_batch_size", "sampler", "drop_last", "max_steps", *TEMPLATE_KEYS}
JOB_BUDGET_MS = 60_000.0
"""Default planning budget of one step in a job (a cap, not a target: the heuristic's loops are
bounded and end long before it, so the clock never decides a plan)."""
MAX_BATCH = 10**7
MAX_WORKERS = 256
"""Most worker processes one job may ask for (``workers`` of a job document)."""


@dataclass(frozen=True)
class SamplerSpec:
    kind: str = "sequential"
    seed: int = 0
    epoch: int = 0
    group_batches: int = 16
    """length-grouped: how many steps' worth of samples are sorted by length together."""


@dataclass(frozen=True)
class JobSpec:
    template: dict[str, Any]
    """The plan request of every step, without its batch."""
    global_batch_size: int | None = None
    sampler: SamplerSpec = SamplerSpec()
    drop_last: bool = False
    max_steps: int | None = None
    dataset_path: str | None = None
    samples: list[Any] | None = None
    batches: list[Any] | None = None

    def inputs_hash(self, data_fingerprint: str) -> str:
        """A digest of everything that decides the plans: a journal is only resumed under the same one."""
        doc = {
            "template": self.template,
            "global_batch_size": self.global_batch_size,
            "sampler": self.sampler.__dict__,
            "drop_last": self.drop_last,
            "max_steps": self.max_steps,
            "data": data_fingerprint,
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _int(doc: Mapping[str, Any], key: str, where: str, default: Any, low: int, high: int, hint: str) -> Any:
    value = doc.get(key)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProblemError(f"must be an integer from {low} to {high}, got {value!r}", field=f"{where}{key}", hint=hint)
    return value


def sampler_from_json(doc: Any) -> SamplerSpec:
    if doc is None:
        return SamplerSpec()
    if isinstance(doc, str):
        doc = {"kind": doc}
    if not isinstance(doc, Mapping):
        raise ProblemError(
            f"must be an object, got {type(doc).__name__}", field="sampler", hint='e.g. {"kind": "shuffle", "seed": 0}.'
        )
    extra = sorted(set(doc) - {"kind", "seed", "epoch", "group_batches"})
    if extra:
        raise ProblemError(
            f"unknown field(s) {extra}",
            field="sampler",
            hint="allowed fields are ['epoch', 'group_batches', 'kind', 'seed'].",
        )
    kind = doc.get("kind", "sequential")
    if kind not in SAMPLERS:
        raise ProblemError(
            f"must be one of {SAMPLERS}, got {kind!r}",
            field="sampler.kind",
            hint="use 'sequential', 'shuffle' or 'length-grouped'.",
        )
    return SamplerSpec(
        kind=kind,
        seed=_int(doc, "seed", "sampler.", 0, 0, 2**63 - 1, "give a non-negative integer seed."),
        epoch=_int(doc, "epoch", "sampler.", 0, 0, 2**31 - 1, "give the epoch number (0, 1, ...)."),
        group_batches=_int(
            doc,
            "group_batches",
            "sampler.",
            16,
            1,
            100_000,
            "give how many steps' samples are sorted by length together, e.g. 16.",
        ),
    )


def job_options(options: Any) -> dict[str, Any]:
    """The options of every step's request: the caller's, with the heuristic and a generous budget by
    default (deterministic plans); an exact backend is asked for its deterministic mode."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ProblemError(
            f"must be an object, got {type(options).__name__}",
            field="options",
            hint="give the options document of a plan request.",
        )
    out = dict(options)
    out.setdefault("backend", "heuristic")
    if out["backend"] == "heuristic":
        out.setdefault("time_budget_ms", JOB_BUDGET_MS)
    else:
        out.setdefault("deterministic", True)
    return out


def job_from_json(doc: Any, *, allow_path: bool = True) -> JobSpec:
    """Read a job document (see the module docstring); ``allow_path=False`` refuses dataset paths (the service)."""
    if not isinstance(doc, Mapping):
        raise ProblemError(
            f"must be a JSON object, got {type(doc).__name__}",
            field="job",
            hint="see jobs/spec.py for the job document.",
        )
    extra = sorted(set(doc) - JOB_KEYS)
    if extra:
        raise ProblemError(f"unknown field(s) {extra}", field="job", hint=f"allowed fields are {sorted(JOB_KEYS)}.")
    dataset, batches = doc.get("dataset"), doc.get("batches")
    if (dataset is None) == (batches is None):
        raise ProblemError(
            "give either 'dataset' or 'batches'",
            field="dataset",
            hint=(
                'e.g. "dataset": {"samples": [...]} with "global_batch_size", or "batches": [{"samples": [...]}, ...].'
            ),
        )
    path = samples = None
    if dataset is not None:
        if not isinstance(dataset, Mapping) or set(dataset) - {"path", "samples"} or len(dataset) != 1:
            raise ProblemError(
                "must be an object with exactly one of 'path' or 'samples'",
                field="dataset",
                hint='e.g. {"path": "samples.jsonl"} or {"samples": [{"id": "a", "text_tokens": 100}]}.',
            )
        if "path" in dataset:
            if not allow_path:
                raise ProblemError(
                    "a server-side path is not accepted here",
                    field="dataset.path",
                    hint='send the samples inline: {"samples": [...]}.',
                )
            path = dataset["path"]
            if not isinstance(path, str) or not path:
                raise ProblemError(
                    f"must be a file path, got {path!r}", field="dataset.path", hint="give a .jsonl or .parquet file."
                )
        else:
            samples = dataset["samples"]
            if not isinstance(samples, list) or not samples:
                raise ProblemError(
                    "must be a non-empty list of samples",
                    field="dataset.samples",
                    hint="list the samples as in a batch document.",
                )
        size = _int(doc, "global_batch_size", "", None, 1, MAX_BATCH, "give the samples per step, e.g. 512.")
        if size is None:
            raise ProblemError(
                "is required with 'dataset'", field="global_batch_size", hint="give the samples per step, e.g. 512."
            )
    else:
        if not isinstance(batches, list) or not batches:
            raise ProblemError(
                "must be a non-empty list of batch documents",
                field="batches",
                hint='e.g. [{"samples": [...]}, {"samples": [...]}].',
            )
        if doc.get("global_batch_size") is not None or doc.get("sampler") is not None:
            raise ProblemError(
                "apply to 'dataset' only",
                field="global_batch_size" if doc.get("global_batch_size") is not None else "sampler",
                hint="explicit batches are planned as given; drop the field.",
            )
        size = None
    drop_last = doc.get("drop_last", False)
    if not isinstance(drop_last, bool):
        raise ProblemError(f"must be true or false, got {drop_last!r}", field="drop_last", hint="use a JSON boolean.")
    template = {k: doc[k] for k in TEMPLATE_KEYS if doc.get(k) is not None}
    template["options"] = job_options(doc.get("options"))
    return JobSpec(
        template=template,
        global_batch_size=size,
        sampler=sampler_from_json(doc.get("sampler")),
        drop_last=drop_last,
        max_steps=_int(doc, "max_steps", "", None, 1, 10**9, "give the most steps to plan, or leave it out."),
        dataset_path=path,
        samples=samples,
        batches=batches,
    )


def check_template(template: Mapping[str, Any]) -> None:
    """Validate the cluster, model, profile and options once, before any step is planned."""
    from optimizer.problem.documents import problem_from_json

    problem_from_json({**template, "batch": {"samples": [{"id": "probe", "text_tokens": 1}]}})
