"""The step cutter: from a job document to the epoch's steps (row indices into the dataset)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs import dataset as ds
from jobs.samplers import epoch_steps
from jobs.spec import JobSpec, check_template
from optimizer.errors import ProblemError


@dataclass
class Epoch:
    spec: JobSpec
    data: ds.Dataset
    steps: list[np.ndarray]
    """Row indices of each step, in step order."""
    inputs_hash: str

    def __len__(self) -> int:
        return len(self.steps)

    def step_samples(self, step: int) -> list[Any]:
        return [self.data.samples[r] for r in self.steps[step].tolist()]

    def step_error(self, step: int) -> tuple[int, ProblemError] | None:
        """The first invalid row of ``step`` and its error, if any."""
        if not self.data.errors:
            return None
        for r in self.steps[step].tolist():
            if r in self.data.errors:
                return r, self.data.errors[r]
        return None


def _model(template: dict[str, Any]) -> Any:
    from optimizer.presets import load_preset
    from optimizer.problem.documents import model_from_json

    if template.get("model") is not None:
        return model_from_json(template["model"])
    return model_from_json(load_preset("models", template.get("model_preset", "llama3-8b"), "model_preset"))


def build_epoch(spec: JobSpec) -> Epoch:
    """Check the template, read and check the dataset (or batches), and cut the epoch into steps."""
    check_template(spec.template)
    model = _model(spec.template)
    if spec.batches is not None:
        rows: list[Any] = []
        bounds = []
        for k, b in enumerate(spec.batches):
            samples = b.get("samples") if isinstance(b, dict) else None
            if not isinstance(samples, list) or not samples:
                raise ProblemError(
                    "must be a batch document with a non-empty 'samples' list",
                    field=f"batches[{k}]",
                    hint='e.g. {"samples": [{"id": "a", "text_tokens": 100}]}.',
                )
            bounds.append((len(rows), len(rows) + len(samples)))
            rows.extend(samples)
        data = ds.load(rows, model, ds.inline_fingerprint(spec.batches), "batches", lengths=False)
        steps = [np.arange(a, b, dtype=np.int64) for a, b in bounds]
    else:
        measure = spec.sampler.kind == "length-grouped"
        if spec.dataset_path is not None:
            rows, digest = ds.read_rows(spec.dataset_path)
            data = ds.load(rows, model, digest, spec.dataset_path, lengths=measure)
        else:
            data = ds.load(
                list(spec.samples or []), model, ds.inline_fingerprint(spec.samples), "dataset.samples", lengths=measure
            )
        assert spec.global_batch_size is not None
        steps = epoch_steps(data.lengths, spec.global_batch_size, spec.sampler, spec.drop_last)
        if not steps:
            raise ProblemError(
                f"the dataset's {len(data)} samples make no full step of {spec.global_batch_size}",
                field="global_batch_size",
                hint="lower global_batch_size or set drop_last to false.",
            )
    if spec.max_steps is not None:
        steps = steps[: spec.max_steps]
    return Epoch(spec=spec, data=data, steps=steps, inputs_hash=spec.inputs_hash(data.fingerprint))
