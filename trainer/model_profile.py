"""Profiling the user's own model: its dimensions from a preset, a model document or a Hugging Face config,
timed at two depths within a time budget and extrapolated to its depth.

Where the model comes from (:func:`model_dims`): ``dhp profile --model-preset NAME`` (the planner's presets),
``--model FILE`` (a model document, as ``dhp plan --model`` reads) or ``--hf-config DIR_OR_JSON`` (a
``config.json`` of a Llama- or Qwen2-family model). The model is built with random weights from those
dimensions; nothing is downloaded.

Depth. A model of many layers does not fit, or takes too long, on a profiling machine; every block of a
decoder does the same work, so the profile is measured on the model cut to 1 and to 2 blocks (its
embeddings and output head kept whole) and each coefficient is extrapolated linearly to the model's
depth: ``c(layers) = c1 + (layers - 1) (c2 - c1)`` (non-negative). The transfer volume and the ring's
messages follow the full depth (:func:`trainer.profiler.comm_terms`, :func:`trainer.profiler.group_messages`).

Budget. Before timing, one short point is timed and every point of the grid is estimated from it by its
work (tokens per rank times the dense work per token plus attention's, which grows with the length); the
grid is cut (longest lengths first, then the per-sample mixes, then the widest groups, then the repeats)
until the estimate fits ``--budget-s``, and the estimate is printed before the measurements start.

Spans. One machine's processes measure the transfers inside a node; the inter-node terms come from the
cluster document when one is given (``--cluster-preset``, ``--cluster``), and the report says so.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optimizer.errors import ProblemError
from trainer.profiler import (
    ProfileSettings,
    _combos,
    build_model,
    comm_terms,
    group_messages,
    measure_profile,
    resolve_device,
    time_group,
)
from trainer.tiny_model import TinyConfig

Progress = Callable[[str], None]
DEPTHS = (1, 2)
"""Blocks the model is cut to for timing."""
HF_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
"""``model_type`` values of a Hugging Face config and the architecture built for them."""


@dataclass(frozen=True)
class ModelDims:
    """What the profiler builds: the architecture and the model's dimensions."""

    name: str
    architecture: str
    config: TinyConfig
    kv_heads: int
    source: str

    @property
    def layers(self) -> int:
        return self.config.layers


def _positive(doc: dict[str, Any], key: str, where: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProblemError(f"{key} must be a positive integer, got {value!r}", field=where, hint=f"check {key}.")
    return value


def from_hf_config(path: str) -> ModelDims:
    """The dimensions of a Hugging Face ``config.json`` (a directory holding one, or the file)."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ProblemError(
            f"cannot read {file} as JSON: {exc}", field="--hf-config", hint="give a config.json or its directory."
        ) from None
    kind = doc.get("model_type")
    if kind not in HF_FAMILIES:
        raise ProblemError(
            f"model_type {kind!r} is not one this profiler builds",
            field="--hf-config",
            hint=f"give a config of model_type {', '.join(sorted(HF_FAMILIES))}, or pass --model-preset / --model.",
        )
    if doc.get("use_sliding_window"):
        raise ProblemError(
            "the config asks for sliding-window attention", field="--hf-config", hint="set use_sliding_window false."
        )
    heads = _positive(doc, "num_attention_heads", "--hf-config")
    cfg = TinyConfig(
        vocab=_positive(doc, "vocab_size", "--hf-config"),
        hidden=_positive(doc, "hidden_size", "--hf-config"),
        heads=heads,
        layers=_positive(doc, "num_hidden_layers", "--hf-config"),
        ffn_hidden=_positive(doc, "intermediate_size", "--hf-config"),
        max_positions=int(doc.get("max_position_embeddings") or 4096),
    )
    kv = int(doc.get("num_key_value_heads") or heads)
    return ModelDims(
        str(doc.get("_name_or_path") or file.stem), HF_FAMILIES[kind], cfg, kv, f"Hugging Face config {file}"
    )


def _from_spec(llm: Any, name: str, source: str) -> ModelDims:
    cfg = TinyConfig(
        vocab=llm.vocab,
        hidden=llm.hidden,
        heads=llm.heads,
        layers=llm.layers,
        ffn_hidden=llm.ffn_hidden,
        max_positions=max(4096, getattr(llm, "max_positions", 4096) or 4096),
    )
    return ModelDims(name, "llama", cfg, llm.kv_heads, source)


def from_model_preset(name: str) -> ModelDims:
    from optimizer.presets import load_preset
    from optimizer.problem.documents import model_from_json

    model = model_from_json(load_preset("models", name, "--model-preset"))
    return _from_spec(model.llm, model.name, f"model preset {name}")


def from_model_file(path: str) -> ModelDims:
    from optimizer.problem.documents import model_from_json, read_json_file

    model = model_from_json(read_json_file(path, "--model"), "--model")
    return _from_spec(model.llm, model.name, f"model document {path}")


def model_dims(preset: str | None, model_file: str | None, hf_config: str | None) -> ModelDims | None:
    """The model a ``dhp profile`` call names (None: none named, the built-in small model)."""
    given = [x for x in (preset, model_file, hf_config) if x]
    if len(given) > 1:
        raise ProblemError(
            "give one of --model-preset, --model and --hf-config", field="--model-preset", hint="drop the others."
        )
    if preset:
        return from_model_preset(preset)
    if model_file:
        return from_model_file(model_file)
    if hf_config:
        return from_hf_config(hf_config)
    return None


def default_lengths(dims: ModelDims) -> tuple[int, ...]:
    """Log-spaced lengths from 256 tokens to the model's positions (at most 16,384)."""
    top = max(512, min(dims.config.max_positions, 16_384))
    n = 7
    return tuple(sorted({int(round(256 * (top / 256) ** (k / (n - 1)) / 64) * 64) for k in range(n)}))


# -- the budget ---------------------------------------------------------------------------------


def _work(dims: ModelDims, depth: int, length: int, d: int, n: int) -> float:
    """Relative work of one rank's part of a group: tokens per rank times (dense + attention) per token."""
    c = dims.config
    kv_width = c.hidden * dims.kv_heads / c.heads
    dense = 2 * c.hidden * c.hidden + 2 * c.hidden * kv_width + 3 * c.hidden * c.ffn_hidden
    per_token = depth * (dense + 2 * c.hidden * length) + c.hidden * c.vocab
    return n * (length / d) * per_token


def estimate_s(settings: ProfileSettings, dims: ModelDims, probe_s: float, probe_work: float) -> float:
    """Seconds the grid takes at both depths, from the probe's seconds per unit of work."""
    rate = probe_s / probe_work
    runs = settings.repeats + settings.warmup
    return sum(
        runs * max(probe_s * 0.5, rate * _work(dims, depth, L, d, n))
        for depth in DEPTHS
        for L, d, n in _combos(settings)
    )


def fit_budget(
    settings: ProfileSettings, dims: ModelDims, probe_s: float, probe_work: float, budget_s: float
) -> tuple[ProfileSettings, float, list[str]]:
    """The grid cut until its estimate fits the budget, the estimate, and what was cut."""
    cut: list[str] = []
    s = settings
    while (est := estimate_s(s, dims, probe_s, probe_work)) > budget_s:
        if len(s.lengths) > 3:
            cut.append(f"length {s.lengths[-1]}")
            s = replace(s, lengths=s.lengths[:-1])
        elif len(s.mixes) > 2:
            cut.append(f"mix {s.mixes[-1]}")
            s = replace(s, mixes=s.mixes[:-1])
        elif s.short_mix > 4:
            cut.append(f"short mix {s.short_mix}")
            s = replace(s, short_mix=s.short_mix // 2)
        elif len(s.degrees) > 2:
            cut.append(f"group size {s.degrees[-1]}")
            s = replace(s, degrees=s.degrees[:-1])
        elif s.repeats > 1:
            cut.append(f"repeat {s.repeats}")
            s = replace(s, repeats=s.repeats - 1)
        else:
            raise ProblemError(
                f"even the smallest grid takes an estimated {est:.0f} s, more than --budget-s {budget_s:g}",
                field="--budget-s",
                hint=f"raise --budget-s to {math.ceil(est * 1.2)} or more, or give shorter --lengths.",
            )
    return s, est, cut


# -- measuring and extrapolating ------------------------------------------------------------------


def unseparated(shallow: dict[str, Any], deep: dict[str, Any]) -> list[str]:
    """The time terms the 2-block fit does not put above the 1-block fit: timing noise (a busy machine, too
    few repeats) hides what one more block adds, so their growth with the depth is not measured."""
    return [
        key for key, a in shallow["time"].items() if float(a) > 0.0 and float(deep["time"].get(key, 0.0)) <= float(a)
    ]


def extrapolate(shallow: dict[str, Any], deep: dict[str, Any], layers: int) -> dict[str, float]:
    """The time terms at ``layers`` blocks from those at 1 and 2 blocks: linear in the depth; a term of
    :func:`unseparated` is the 2-block fit's scaled to the depth, as if all of it grew with the blocks (a
    line through the two fits would fall, to zero at worst: a model that costs nothing)."""
    out = {}
    flat = unseparated(shallow, deep)
    for key, a in shallow["time"].items():
        b = float(deep["time"].get(key, 0.0))
        out[key] = max(0.0, b) * layers / DEPTHS[1] if key in flat else float(a) + (layers - 1) * (b - float(a))
    return out


def profile_model(
    dims: ModelDims,
    settings: ProfileSettings,
    budget_s: float,
    progress: Progress,
    *,
    bandwidth: float | None,
    min_r2: float,
    max_error: float,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure ``dims``'s model at :data:`DEPTHS` within ``budget_s`` and extrapolate; (profile, report)."""
    import torch

    device = resolve_device(settings.device)
    settings = replace(settings, architecture=dims.architecture, kv_heads=dims.kv_heads)
    t0 = time.perf_counter()
    probe_cfg = replace(
        dims.config, layers=DEPTHS[0], max_positions=max(dims.config.max_positions, max(settings.lengths) + 1)
    )
    model = build_model(probe_cfg, settings, device)
    shortest = min(settings.lengths)
    probe_s = time_group(model, (shortest,), 1, device, repeats=1, warmup=1)
    del model
    work = _work(dims, DEPTHS[0], shortest, 1, 1)
    fitted, est, cut = fit_budget(settings, dims, probe_s, work, budget_s)
    n_points = len(_combos(fitted))
    progress(
        f"{dims.name} ({dims.source}): {dims.layers} blocks of width {dims.config.hidden}, {dims.config.heads}/"
        f"{dims.kv_heads} heads, MLP {dims.config.ffn_hidden}, vocabulary {dims.config.vocab}; timed at "
        f"{' and '.join(map(str, DEPTHS))} blocks on {device}: {n_points} points x {len(DEPTHS)} depths, "
        f"estimated {est:.0f} s (budget {budget_s:g} s)" + (f"; cut to fit: {', '.join(cut)}" if cut else "")
    )
    results = []
    for depth in DEPTHS:
        cfg = replace(probe_cfg, layers=depth)
        results.append(
            measure_profile(
                cfg, fitted, progress, bandwidth=bandwidth, min_r2=min_r2, max_error=max_error, bar=f"{depth} block(s)"
            )
        )
    (shallow, r1), (deep, r2) = results
    profile = json.loads(json.dumps(deep))
    profile["time"] = extrapolate(shallow, deep, dims.layers)
    if profile["time"].get("linear", 0.0) + profile["time"].get("quadratic", 0.0) <= 0.0:
        raise ProblemError(
            f"the {DEPTHS[1]}-block fit puts no time on the tokens (its linear and quadratic terms are 0): the "
            "timings are noise (the grid's runs are too short for this machine's load)",
            field="--lengths",
            hint="give longer --lengths, more --repeats, or run on an idle machine.",
        )
    flat = unseparated(shallow, deep)
    if flat:
        progress(
            f"{', '.join(flat)}: the {DEPTHS[1]}-block fit is not above the {DEPTHS[0]}-block one (timing noise); "
            f"scaled from {DEPTHS[1]} blocks to {dims.layers} instead. On an idle machine, or with more --repeats, "
            "the two depths separate"
        )
    full = replace(dims.config, layers=dims.layers)
    bpt, _ = comm_terms(full, getattr(torch, settings.dtype), dims.kv_heads)
    g1, g0 = group_messages(full)
    profile["comm"]["bytes_per_token"] = bpt
    profile["comm"]["group_messages"] = {"per_step": g1, "fixed": g0}
    elapsed = time.perf_counter() - t0
    profile["source"] = (
        f"dhp profile of {dims.name} ({dims.source}, random weights) on {device}: timed at 1 and 2 of its "
        f"{dims.layers} blocks and extrapolated, {n_points} points per depth in {elapsed:.0f} s"
    )
    report = {
        "model": {"name": dims.name, "source": dims.source, "layers": dims.layers, "architecture": dims.architecture},
        "depths": {str(d): r for d, r in zip(DEPTHS, (r1, r2), strict=True)},
        "points": n_points,
        "estimate_s": est,
        "elapsed_s": elapsed,
        "cut_to_fit_budget": cut,
        "scaled_from_the_deeper_fit": flat,
        "lengths": list(fitted.lengths),
        "degrees": list(fitted.degrees),
        "mixes": list(fitted.mixes),
    }
    return profile, report


def inter_node_terms(profile: dict[str, Any], cluster: tuple[str, Any] | None) -> str:
    """Set the profile's inter-node bandwidth and latency from the cluster (where from, cluster), or leave them
    equal to the intra-node ones; says which, for the report and the profile's source."""
    comm = profile["comm"]
    if cluster is None:
        said = (
            "not measured (this launch does not span nodes): equal to the intra-node terms; give "
            "--cluster-preset or --cluster to take them from the cluster"
        )
    else:
        where, c = cluster
        comm["bandwidth_bytes_per_s"]["inter"] = float(c.inter_bandwidth)
        if "latency_s" in comm:
            comm["latency_s"]["inter"] = float(c.inter_latency)
        said = (
            f"from the {where} (this launch does not span nodes): {c.inter_bandwidth:.3g} bytes/s, "
            f"{c.inter_latency * 1e6:.1f} us per message"
        )
    profile["source"] = f"{profile.get('source', 'dhp profile')}; inter-node terms {said}"
    return said
