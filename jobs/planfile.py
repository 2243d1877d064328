"""The plan file of an epoch (Parquet, one row a step, in step order), its JSON index, and the
journal that lets a killed job resume.

Columns of ``plan.parquet``: ``step``, ``status`` (``ok`` or ``failed``), ``sample_ids`` (the step's
samples in sampler order), ``predicted_step_time_s``, ``lower_bound_s``, ``gap``,
``micro_batches``, ``static_step_time_s`` and ``static_degree`` (the step's best static
power-of-two layout), ``static_degrees`` / ``static_times`` (the best static layout of each size
that fits the step), ``communicators`` (groups of two or more ranks the step uses),
``new_communicators`` (of those, the ones no earlier step used: what a trainer creates at that
step), ``plan`` (the plan as JSON: micro-batches of groups with ranks, samples, lengths and
predicted times; :func:`trainer.apply.apply_plan` reads it) and ``error`` (JSON naming the field
and sample of a failed step). Nothing in it depends on the clock or the engine: the same epoch
gives the same bytes.

The journal (``journal.jsonl``) gets one line per planned step as results arrive, after a header
naming the job's inputs; a resumed job reads it and plans only the steps it lacks.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError

PLAN_FILE = "plan.parquet"
INDEX_FILE = "index.json"
JOURNAL_FILE = "journal.jsonl"
FORMAT = "dhp-epoch-plan"
VERSION = 1
ROW_GROUP = 256


class Journal:
    """Append-only record of planned steps (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: Any = None

    def load(self, inputs_hash: str, total: int) -> dict[int, dict[str, Any]]:
        """Steps already planned for these inputs; a journal of other inputs is refused."""
        if not self.path.exists():
            return {}
        done: dict[int, dict[str, Any]] = {}
        with self.path.open("rb") as fh:
            lines = fh.read().split(b"\n")
        if not lines or not lines[0].strip():
            return {}
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = {}
        if header.get("inputs_hash") != inputs_hash or header.get("steps") != total:
            raise ProblemError(
                f"{self.path.parent} holds a job planned from other inputs",
                field="--out",
                hint="use another output directory, or --fresh to discard the earlier job's progress.",
            )
        for line in lines[1:]:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed job may be cut short; that step is planned again
            done[int(record["step"])] = record
        return done

    def open(self, inputs_hash: str, total: int) -> None:
        fresh = not self.path.exists() or self.path.stat().st_size == 0
        self._fh = self.path.open("ab")
        if fresh:
            self._write({"format": FORMAT + "-journal", "inputs_hash": inputs_hash, "steps": total})
        else:
            # a line cut short by a kill is ended, so that the next record starts on its own line
            with self.path.open("rb") as fh:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    self._fh.write(b"\n")

    def _write(self, doc: dict[str, Any]) -> None:
        self._fh.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            self._write(r)
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)


def new_communicators(records: list[dict[str, Any]]) -> list[int]:
    """For each step in order, how many of its groups no earlier step used."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for r in records:
        groups = [tuple(c) for c in r.get("communicators") or ()]
        fresh = [g for g in groups if g not in seen]
        seen.update(fresh)
        out.append(len(set(fresh)))
    return out


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("step", pa.int64()),
            ("status", pa.string()),
            ("sample_ids", pa.list_(pa.string())),
            ("predicted_step_time_s", pa.float64()),
            ("lower_bound_s", pa.float64()),
            ("gap", pa.float64()),
            ("micro_batches", pa.int64()),
            ("static_step_time_s", pa.float64()),
            ("static_degree", pa.int64()),
            ("static_degrees", pa.list_(pa.int64())),
            ("static_times", pa.list_(pa.float64())),
            ("communicators", pa.int64()),
            ("new_communicators", pa.int64()),
            ("plan", pa.string()),
            ("error", pa.string()),
        ]
    )


def write_plan_file(path: Path, records: list[dict[str, Any]]) -> str:
    """Write the records (in step order) as the plan file; returns its sha256."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fresh = new_communicators(records)
    rows = []
    for r, new in zip(records, fresh, strict=True):
        ok = r["status"] == "ok"
        rows.append(
            {
                "step": r["step"],
                "status": r["status"],
                "sample_ids": r["sample_ids"],
                **{
                    k: r.get(k)
                    for k in (
                        "predicted_step_time_s",
                        "lower_bound_s",
                        "gap",
                        "micro_batches",
                        "static_step_time_s",
                        "static_degree",
                        "static_degrees",
                        "static_times",
                        "plan",
                    )
                },
                "communicators": len(r["communicators"]) if ok else None,
                "new_communicators": new if ok else None,
                "error": json.dumps(r["error"], sort_keys=True) if r.get("error") else None,
            }
        )
    table = pa.Table.from_pylist(rows, schema=_schema())
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(table, tmp, compression="zstd", row_group_size=ROW_GROUP)
    os.replace(tmp, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_index(path: Path, index: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(index, indent=2) + "\n")
    os.replace(tmp, path)


def read_index(directory: Path) -> dict[str, Any] | None:
    p = directory / INDEX_FILE
    if not p.exists():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def read_plan_table(path: str | Path, columns: list[str] | None = None) -> Any:
    """The plan file as a pyarrow table (``path``: the file or its directory)."""
    import pyarrow.parquet as pq

    p = Path(path)
    if p.is_dir():
        p = p / PLAN_FILE
    try:
        return pq.read_table(p, columns=columns)
    except FileNotFoundError:
        raise ProblemError(
            f"no plan file at {p}",
            field="plan_file",
            hint="run 'dhp plan-epoch' first, or give the directory it wrote.",
        ) from None
    except Exception as exc:
        raise ProblemError(
            f"cannot read {p}: {exc}", field="plan_file", hint="give a plan.parquet written by 'dhp plan-epoch'."
        ) from None
