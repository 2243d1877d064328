"""Datasets of sample descriptors: JSONL (one sample object a line) or Parquet (one sample a row),
each sample as in a batch document: ``id``, ``text_tokens``, ``images``, ``videos``.

Parquet columns: ``id`` (string), ``text_tokens`` (integer), ``images`` and ``videos`` (lists of
structs with ``tokens``, ``width``, ``height``, ``frames``, ``tokens_per_frame``; null members are
left out). A row that is not a valid sample (a missing id, no tokens, a bad image) is kept with its
error, so that the step it falls into fails naming it while the other steps are planned: rows are
checked here (in full when the sampler needs lengths) or, at the latest, when their step is
planned. A file that cannot be read at all, or ids that repeat, stop the job at once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.errors import ProblemError
from optimizer.problem.batch import Batch
from optimizer.problem.documents import batch_from_json
from optimizer.problem.model import ModelSpec
from optimizer.problem.text import HINT as TEXT_HINT
from optimizer.problem.text import first_bad_text, may_break_rule


@dataclass
class Dataset:
    samples: list[dict[str, Any]]
    """Sample documents, in file order."""
    lengths: np.ndarray
    """Sequence length of each sample (0 for an invalid one, or for all when not measured)."""
    errors: dict[int, ProblemError] = field(default_factory=dict)
    """Row index -> why the row is not a valid sample."""
    fingerprint: str = ""
    """sha256 of the file's bytes (or of the inline samples)."""
    source: str = "dataset"

    def __len__(self) -> int:
        return len(self.samples)

    def sample_id(self, row: int) -> str:
        sid = self.samples[row].get("id") if isinstance(self.samples[row], dict) else None
        return sid if isinstance(sid, str) and sid else f"row {row}"


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def read_jsonl(path: Path) -> list[Any]:
    rows = []
    with path.open("rb") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ProblemError(
                    f"{path} line {line_no} is not valid JSON ({exc.msg})",
                    field="dataset.path",
                    hint="write one sample object per line.",
                ) from None
    return rows


def read_parquet(path: Path) -> list[Any]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise ProblemError(
            f"cannot read {path} as Parquet: {exc}",
            field="dataset.path",
            hint="give a Parquet file with one sample a row.",
        ) from None
    names = set(table.column_names)
    if "id" not in names:
        raise ProblemError(
            f"{path} has no column 'id' (columns: {sorted(names)})",
            field="dataset.path",
            hint="add a string column 'id' with each sample's unique id.",
        )
    extra = sorted(names - {"id", "text_tokens", "images", "videos"})
    if extra:
        raise ProblemError(
            f"{path} has unknown column(s) {extra}",
            field="dataset.path",
            hint="keep only id, text_tokens, images and videos.",
        )
    # column by column: much faster than a dictionary per row from pyarrow
    ids = table.column("id").to_pylist()
    rows: list[dict[str, Any]] = [{"id": sid} if sid is not None else {} for sid in ids]
    if "text_tokens" in names:
        for row, text in zip(rows, table.column("text_tokens").to_pylist(), strict=True):
            if text is not None:
                row["text_tokens"] = text
    for key in ("images", "videos"):
        if key in names:
            for row, items in zip(rows, table.column(key).to_pylist(), strict=True):
                if items:
                    row[key] = [
                        {k: v for k, v in item.items() if v is not None} for item in items
                    ]  # struct members are scalars
    return rows


def read_rows(path: str | Path) -> tuple[list[Any], str]:
    """The rows of a JSONL or Parquet file and the sha256 of its bytes."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ProblemError(
            f"cannot read {p}: {exc.strerror or exc}", field="dataset.path", hint="check the path."
        ) from None
    if p.suffix == ".parquet":
        rows = read_parquet(p)
        suspect = any(
            isinstance(sid := row.get("id"), str) and "\x00" in sid for row in rows
        )  # Arrow strings may hold NUL, never a lone surrogate
    elif p.suffix in (".jsonl", ".ndjson"):
        rows = read_jsonl(p)
        suspect = may_break_rule(data)
    else:
        raise ProblemError(
            f"{p.name}: unknown dataset format", field="dataset.path", hint="use a .jsonl or .parquet file."
        )
    bad = first_bad_text(rows, "dataset") if suspect else None
    if bad is not None:
        raise ProblemError(f"{p.name}: {bad[0]} {bad[1]}", field="dataset.path", hint=TEXT_HINT)
    return rows, hashlib.sha256(data).hexdigest()


def _check_row(row: Any, k: int, model: ModelSpec | None) -> tuple[int, ProblemError | None]:
    where = f"dataset[{k}]"
    if not isinstance(row, dict):
        return 0, ProblemError(
            f"must be a JSON object, got {type(row).__name__}",
            field=where,
            hint="give each sample as an object with 'id'.",
        )
    if row.get("id") is None:
        return 0, ProblemError("is required", field=f"{where}.id", hint="give every sample a unique string id.")
    try:
        batch = batch_from_json({"samples": [row]}, model, where="batch")
    except ProblemError as exc:
        tail = (exc.field or "").removeprefix("batch.samples[0]")
        return 0, ProblemError(
            exc.message, field=f"{where}{tail}" if tail.startswith((".", "[")) else where, hint=exc.hint
        )
    return batch.lengths[0], None


def _all_valid(rows: list[Any], model: ModelSpec | None) -> np.ndarray | None:
    """The lengths when every row is a valid sample with an id (the common, fast case); else None."""
    if any(not isinstance(r, dict) or r.get("id") is None for r in rows):
        return None
    try:
        batch: Batch = batch_from_json({"samples": rows}, model, where="batch")
    except ProblemError:
        return None
    return np.asarray(batch.lengths, dtype=np.int64)


def load(
    rows: list[Any], model: ModelSpec | None, fingerprint: str, source: str = "dataset", lengths: bool = True
) -> Dataset:
    """Check the rows: every row an object with an id, ids unique across the dataset. With
    ``lengths`` every row is also checked as a sample and measured (the length-grouped sampler needs
    the lengths); without, the full check of each sample happens when its step is planned."""
    if not rows:
        raise ProblemError("has no samples", field="dataset", hint="give at least one sample.")
    errors: dict[int, ProblemError] = {}
    seen: dict[str, int] = {}
    for k, row in enumerate(rows):
        sid = row.get("id") if isinstance(row, dict) else None
        if not isinstance(row, dict):
            errors[k] = ProblemError(
                f"must be a JSON object, got {type(row).__name__}",
                field=f"dataset[{k}]",
                hint="give each sample as an object with 'id'.",
            )
        elif sid is None:
            errors[k] = ProblemError(
                "is required", field=f"dataset[{k}].id", hint="give every sample a unique string id."
            )
        elif (isinstance(sid, int) and not isinstance(sid, bool)) or (isinstance(sid, str) and sid):
            key = str(sid)
            if key in seen:
                raise ProblemError(
                    f"sample id {key!r} appears in rows {seen[key]} and {k}",
                    field=f"dataset[{k}].id",
                    hint="make every sample id unique.",
                )
            seen[key] = k
        else:
            errors[k] = ProblemError(
                f"must be a non-empty string, got {sid!r}",
                field=f"dataset[{k}].id",
                hint="give every sample a unique string id.",
            )
    measured = np.zeros(len(rows), dtype=np.int64)
    if lengths:
        fast = None if errors else _all_valid(rows, model)
        if fast is not None:
            measured = fast
        else:
            for k, row in enumerate(rows):
                if k not in errors:
                    measured[k], err = _check_row(row, k, model)
                    if err is not None:
                        errors[k] = err
    return Dataset(samples=rows, lengths=measured, errors=errors, fingerprint=fingerprint, source=source)


def inline_fingerprint(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_jsonl(path: str | Path, samples: list[dict[str, Any]]) -> None:
    with Path(path).open("w") as fh:
        for s in samples:
            fh.write(json.dumps(s, separators=(",", ":")) + "\n")


def write_parquet(path: str | Path, samples: list[dict[str, Any]]) -> None:
    """Samples as a Parquet file with the columns of the module docstring."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    visual = pa.list_(
        pa.struct(
            [
                ("tokens", pa.int64()),
                ("width", pa.int64()),
                ("height", pa.int64()),
                ("frames", pa.int64()),
                ("tokens_per_frame", pa.int64()),
            ]
        )
    )
    schema = pa.schema([("id", pa.string()), ("text_tokens", pa.int64()), ("images", visual), ("videos", visual)])
    table = pa.Table.from_pylist(
        [{k: s.get(k) for k in ("id", "text_tokens", "images", "videos")} for s in samples], schema=schema
    )
    pq.write_table(table, path)
