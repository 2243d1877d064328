"""Benchmark workloads: seeded batch generators with the longest sample each one allows, and replay files.

The generators are those of :mod:`optimizer.problem.workloads`; this module adds what a benchmark needs
on top: the model each workload trains, and the longest sample the workload allows (a training
configuration's maximum sequence length, not the longest sample of one batch). A static mesh as
deployed must fit that longest allowed sample, so it is a workload parameter here.

Parameter sources (``/work/shared/docs/field-notes.md``, "Multimodal token counts"):

- image SFT: LLaVA-1.5 (CLIP ViT-L/14 at 336 px) has 576 visual tokens per image; up to 8 images
  per sample and 8,192 text tokens in the generator, so at most 8,192 + 8 x 576 tokens.
- anyres: LLaVA-NeXT / OneVision (SigLIP 384/14) have 729 tokens per crop and anyres grids up to
  6 x 6 crops plus a base view: at most 8,192 + 37 x 729 tokens.
- dynamic resolution: Qwen2-VL has one token per 28 x 28 pixels, 4 to 16,384 tokens per image by
  its default pixel limits; up to 4 images: at most 8,192 + 4 x 16,384 tokens.
- long-tail video: about 196 tokens per frame after pooling (LLaVA-Video / OneVision); log-normal
  frame counts (most clips short, a few long) capped at 1,200 frames (ten minutes at 2 fps):
  at most 4,096 + 1,200 x 196 tokens.
- long-context text: log-normal lengths with median 2K (in one production mix 80% of samples were
  under 4K tokens), tail to 131,072 tokens.
- mixed: the four multimodal and text sources together; it allows the longest of them.

Replay files (:func:`load_replay`) let users benchmark their own length distribution:

- JSON ``{"lengths": [812, 20480, ...], "max_length": 32768}`` (``max_length`` optional: the
  longest length in the file otherwise), or a batch document ``{"samples": [...]}`` as ``dhp plan``
  reads it;
- CSV with a header naming a ``length`` column (text-only samples), or ``text_tokens`` and
  ``visual_tokens`` columns (the visual tokens become one image).

A replayed batch of n samples draws n entries from the file with replacement (seeded), so any batch
size can be replayed from a file of any size.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optimizer.errors import ProblemError
from optimizer.problem import workloads as base

VIDEO_MAX_FRAMES = 1200
VIDEO_TEXT_CAP = 4096
TEXT_CAP = 8192
LONG_TEXT_CAP = 131072


@dataclass(frozen=True)
class Workload:
    """A named batch generator, the model it trains and the longest sample it allows."""

    name: str
    generate: Callable[[int, int], dict[str, Any]]
    """``generate(n, seed)`` -> batch document of n samples."""
    max_length: int
    """Longest sample the workload allows (tokens): what a static mesh as deployed must fit."""
    model_preset: str
    description: str

    def batch(self, n: int, seed: int = 0) -> dict[str, Any]:
        return self.generate(n, seed)


def _gen(f: Callable[..., dict[str, Any]]) -> Callable[[int, int], dict[str, Any]]:
    return lambda n, seed: f(n, seed=seed)


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "video",
            _gen(base.long_tail_video),
            VIDEO_TEXT_CAP + VIDEO_MAX_FRAMES * base.TOKENS_PER_FRAME,
            "qwen2-vl-7b",
            "long-tail video SFT, 196 tokens per frame, log-normal frame counts up to 1,200",
        ),
        Workload(
            "image-sft",
            _gen(base.image_sft),
            TEXT_CAP + 8 * base.TOKENS_PER_LLAVA_IMAGE,
            "qwen2-vl-7b",
            "LLaVA-1.5-style image SFT, 576 tokens per image, 0-8 images",
        ),
        Workload(
            "anyres",
            _gen(base.anyres_images),
            TEXT_CAP + 37 * base.TOKENS_PER_CROP,
            "qwen2-vl-7b",
            "LLaVA-NeXT anyres, 729 tokens per crop, up to 6x6 crops plus a base view",
        ),
        Workload(
            "dynamic-res",
            _gen(base.dynamic_resolution),
            TEXT_CAP + 4 * 16384,
            "qwen2-vl-7b",
            "Qwen2-VL dynamic resolution, 4-16,384 tokens per image, 1-4 images",
        ),
        Workload(
            "long-text",
            _gen(base.long_text),
            LONG_TEXT_CAP,
            "llama3-8b",
            "long-context text, log-normal lengths (median 2K) up to 128K",
        ),
        Workload(
            "mixed",
            _gen(base.mixed),
            VIDEO_TEXT_CAP + VIDEO_MAX_FRAMES * base.TOKENS_PER_FRAME,
            "qwen2-vl-7b",
            "40% image SFT, 20% dynamic resolution, 25% video, 15% long text",
        ),
    )
}


def get_workload(name: str) -> Workload:
    """The workload called ``name``; a path to a replay file (.json / .csv) is loaded as one."""
    if name in WORKLOADS:
        return WORKLOADS[name]
    if name.endswith((".json", ".csv")):
        return load_replay(name)
    raise ProblemError(
        f"unknown workload {name!r}",
        field="--workloads",
        hint=f"use one of {sorted(WORKLOADS)} or a replay file ending in .json or .csv.",
    )


# -- replay ------------------------------------------------------------------------------------


def _positive_int(value: Any, where: str) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ProblemError(
            f"must be a whole number of tokens, got {value!r}", field=where, hint="give token counts as integers."
        ) from None
    if not number.is_integer() or number < 0:
        raise ProblemError(
            f"must be a whole number of tokens >= 0, got {value!r}", field=where, hint="give token counts as integers."
        )
    return int(number)


def _entries_from_json(doc: Any, where: str) -> tuple[list[dict[str, Any]], int | None]:
    if not isinstance(doc, dict):
        raise ProblemError(
            "must be a JSON object", field=where, hint='use {"lengths": [...]} or a batch document {"samples": [...]}.'
        )
    limit = _positive_int(doc["max_length"], f"{where}.max_length") if doc.get("max_length") is not None else None
    if "lengths" in doc:
        lengths = doc["lengths"]
        if not isinstance(lengths, list) or not lengths:
            raise ProblemError(
                "must be a non-empty list of token counts", field=f"{where}.lengths", hint="e.g. [812, 20480, 4096]."
            )
        entries = []
        for k, v in enumerate(lengths):
            n = _positive_int(v, f"{where}.lengths[{k}]")
            if n < 1:
                raise ProblemError(
                    "must be >= 1", field=f"{where}.lengths[{k}]", hint="every sample has at least one token."
                )
            entries.append({"text_tokens": n})
        return entries, limit
    if "samples" in doc:
        from optimizer.problem.documents import batch_from_json

        batch_from_json(doc, where=where)  # validates every sample, names the bad field
        return [{k: v for k, v in s.items() if k != "id"} for s in doc["samples"]], limit
    raise ProblemError(
        "has neither 'lengths' nor 'samples'",
        field=where,
        hint='use {"lengths": [...]} or a batch document {"samples": [...]}.',
    )


def _entries_from_csv(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields = set(reader.fieldnames or [])
        if "length" not in fields and "text_tokens" not in fields:
            raise ProblemError(
                f"header {sorted(fields)} has no 'length' or 'text_tokens' column",
                field=str(path),
                hint="start the file with a header line: length  (or text_tokens,visual_tokens).",
            )
        entries = []
        for row_no, row in enumerate(reader, start=2):
            where = f"{path}:{row_no}"
            if "length" in fields:
                entry: dict[str, Any] = {"text_tokens": _positive_int(row["length"], where)}
            else:
                entry = {"text_tokens": _positive_int(row["text_tokens"], where)}
                visual = _positive_int(row.get("visual_tokens") or 0, where)
                if visual:
                    entry["images"] = [{"tokens": visual}]
            if entry["text_tokens"] + sum(im["tokens"] for im in entry.get("images", [])) < 1:
                raise ProblemError("has no tokens", field=where, hint="every sample has at least one token.")
            entries.append(entry)
    if not entries:
        raise ProblemError("has no rows", field=str(path), hint="add one row per sample under the header.")
    return entries


def _entry_length(entry: dict[str, Any]) -> int:
    return int(entry.get("text_tokens", 0)) + sum(
        int(im["tokens"]) * int(im.get("frames", 1)) for im in entry.get("images", [])
    )


def load_replay(path: str | Path) -> Workload:
    """A workload that replays the lengths of a JSON or CSV file (format in the module docstring)."""
    p = Path(path)
    if not p.is_file():
        raise ProblemError(
            f"no such file: {p}", field="--workloads", hint="give the path of a .json or .csv file of sample lengths."
        )
    if p.suffix == ".csv":
        entries, limit = _entries_from_csv(p), None
    else:
        try:
            doc = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise ProblemError(
                f"is not valid JSON: {exc}",
                field=str(p),
                hint="check the file; see the replay format in bench/workload_catalog.py.",
            ) from None
        entries, limit = _entries_from_json(doc, str(p))
    longest = max(_entry_length(e) for e in entries)
    if limit is not None and limit < longest:
        raise ProblemError(
            f"max_length {limit} is below the longest sample in the file ({longest})",
            field=f"{p}.max_length",
            hint="raise max_length or leave it out.",
        )

    def generate(n: int, seed: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        picks = rng.integers(0, len(entries), size=n)
        return {"samples": [dict(entries[int(k)], id=f"r{i}") for i, k in enumerate(picks)]}

    return Workload(p.stem, generate, limit or longest, "qwen2-vl-7b", f"replay of {p.name} ({len(entries)} samples)")


def save_replay(path: str | Path, lengths: list[int], max_length: int | None = None) -> None:
    """Write ``lengths`` as a JSON replay file."""
    doc: dict[str, Any] = {"lengths": [int(x) for x in lengths]}
    if max_length is not None:
        doc["max_length"] = int(max_length)
    Path(path).write_text(json.dumps(doc))
