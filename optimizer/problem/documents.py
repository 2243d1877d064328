"""Input documents (JSON objects) to domain objects, with errors that name the field.

The same documents are the ``dhp plan`` input files and the parts of a ``POST /v1/plans`` body:
``batch``, ``cluster`` (or ``cluster_preset``), ``model`` (or ``model_preset``), ``profile`` and
``options``. Every function here raises :class:`~optimizer.errors.ProblemError` naming the field
path (``batch.samples[3].images[0].tokens``) and saying how to fix it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.errors import ProblemError
from optimizer.presets import gpu_catalog, load_preset
from optimizer.problem.batch import MAX_SAMPLE_TOKENS, Batch, Image, Sample
from optimizer.problem.checks import Range, shown
from optimizer.problem.cluster import Cluster, GPUType, Node
from optimizer.problem.model import LanguageModel, ModelSpec, TrainingSetup, VisionEncoder
from optimizer.problem.options import OPTION_SPECS, PlanOptions
from optimizer.problem.problem import Problem
from optimizer.problem.text import HINT as TEXT_HINT
from optimizer.problem.text import first_bad_text

_MISSING = object()
MAX_COUNT = 10**9
"""Largest integer any count field accepts (tokens, frames, sizes): far above real batches and
clusters, far below what would overflow the cost arithmetic."""
MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024

QUANTITIES: dict[str, tuple[Range, str]] = {
    "memory": (Range(1e6, 1e15, "bytes"), "give the device memory in bytes, e.g. 80e9."),
    "reserve": (Range(0, 1e15, "bytes"), "give the bytes per GPU kept back for the framework, e.g. 4e9."),
    "flops": (Range(1e6, 1e19, "FLOP/s"), "give the peak dense bf16 FLOP/s, e.g. 989e12."),
    "link": (
        Range(1e6, 1e15, "bytes/s"),
        "give bytes per second per GPU, e.g. 4.5e11 inside a node or 5e10 between nodes.",
    ),
    "bandwidth": (
        Range(1, 1e15, "bytes/s"),
        "give the measured bytes per second (with comm.bytes_per_token in the same bytes), e.g. 4.5e11.",
    ),
    "latency": (
        Range(0, 10, "seconds"),
        "give the latency of one message in seconds, e.g. 5e-6 inside a node or 2e-5 between nodes.",
    ),
    "efficiency": (
        Range(0.01, 1),
        "give the fraction of peak throughput dense kernels reach; a typical model FLOPs utilisation is 0.4 to 0.6.",
    ),
    "parameters": (Range(1, 1e15, "parameters"), "give the parameter count, e.g. 8.03e9."),
    "capacity": (Range(1, MAX_SAMPLE_TOKENS, "tokens"), "give the tokens one rank holds in a micro-batch, e.g. 16384."),
    "speed": (Range(1e-3, 1e3), "give the GPU type's speed relative to the profile's own GPU (1.0), e.g. 0.32."),
    "per_token2": (Range(0, 1, "seconds per token squared"), "give the measured coefficient in SI units, e.g. 1.2e-9."),
    "per_token": (Range(0, 10, "seconds per token"), "give the measured coefficient in SI units, e.g. 8.6e-5."),
    "seconds": (Range(0, 86_400, "seconds"), "give the measured time in seconds, e.g. 3.4e-3."),
    "bytes_per_token": (Range(0, 1e9, "bytes per token"), "give the bytes a token sends, e.g. 172032."),
    "messages": (Range(0, 1e6, "messages"), "give the message count, e.g. 2."),
}
"""Every number of the cluster, model and profile documents is one of these quantities and is checked
against its range (the same rule as the planner options' bounds): wide enough for any real machine or
measurement, narrow enough that no value turns a plan or an error message absurd (a step of 1e300 s,
a rank count of 300 digits)."""


def _obj(doc: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ProblemError(
            f"must be a JSON object, got {type(doc).__name__}",
            field=where,
            hint="see examples/ for the document shapes.",
        )
    return doc


def _unknown(doc: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise ProblemError(f"unknown field(s) {extra}", field=where, hint=f"allowed fields are {sorted(allowed)}.")


def _get(doc: Mapping[str, Any], key: str, where: str, kind: str, default: Any = _MISSING) -> Any:
    path = f"{where}.{key}" if where else key
    if key not in doc or doc[key] is None:
        if default is _MISSING:
            raise ProblemError("is required", field=path, hint=f"add '{key}' ({kind}).")
        return default
    value = doc[key]
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ProblemError(f"must be an integer, got {shown(value)}", field=path, hint="use a whole number.")
        if abs(value) > MAX_COUNT:
            raise ProblemError(
                f"{shown(value)} is too large", field=path, hint=f"use a value of at most {MAX_COUNT:,}."
            )
    elif kind == "number":  # bounded by the caller (the planner options check their own ranges)
        Range().check(value, path, "use a JSON number.")
        value = float(value)
    elif kind in QUANTITIES:
        value = float(_within(value, kind, path))
    elif kind == "str":
        if not isinstance(value, str):
            raise ProblemError(f"must be a string, got {shown(value)}", field=path, hint="use a JSON string.")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ProblemError(f"must be true or false, got {shown(value)}", field=path, hint="use a JSON boolean.")
    elif kind == "list":
        if not isinstance(value, list):
            raise ProblemError(f"must be a list, got {type(value).__name__}", field=path, hint="use a JSON array.")
    elif kind == "object":
        _obj(value, path)
    return value


def _within(value: Any, kind: str, path: str) -> Any:
    """``value`` as given, once it is a number within the range of its quantity (see :data:`QUANTITIES`)."""
    span, hint = QUANTITIES[kind]
    span.check(value, path, hint)
    return value


def _rewhere(exc: ProblemError, prefix: str) -> ProblemError:
    """Re-anchor an error raised by a domain constructor at the document path."""
    field = exc.field or ""
    if field and not field.startswith(prefix):
        tail = field.split(".", 1)[1] if "." in field else field
        field = f"{prefix}.{tail}"
    return ProblemError(exc.message, field=field or prefix, hint=exc.hint)


# -- batch ------------------------------------------------------------------------------------


def batch_from_json(doc: Any, model: ModelSpec | None = None, where: str = "batch") -> Batch:
    doc = _obj(doc, where)
    _unknown(doc, {"samples"}, where)
    samples_doc = _get(doc, "samples", where, "list")
    generated = _generated_ids(samples_doc)
    samples = []
    for k, s in enumerate(samples_doc):
        fast = _sample_fast(s)
        if fast is not None:
            samples.append(fast)
            continue
        # The general path: slower, and its errors name the exact field.
        w = f"{where}.samples[{k}]"
        s = _obj(s, w)
        _unknown(s, {"id", "text_tokens", "images", "videos"}, w)
        sid = s["id"] if "id" in s else generated[k]
        if isinstance(sid, int) and not isinstance(sid, bool):
            sid = str(sid)
        if not isinstance(sid, str) or not sid:
            raise ProblemError(
                f"must be a non-empty string, got {shown(sid)}", field=f"{w}.id", hint="give every sample a unique id."
            )
        text = _get(s, "text_tokens", w, "int", 0)
        if text < 0:
            raise ProblemError(
                f"must be >= 0, got {text}", field=f"{w}.text_tokens", hint="give the number of text tokens."
            )
        images = [_image(im, f"{w}.images[{i}]", model) for i, im in enumerate(_get(s, "images", w, "list", []))]
        images += [
            _image(v, f"{w}.videos[{i}]", model, video=True) for i, v in enumerate(_get(s, "videos", w, "list", []))
        ]
        try:
            samples.append(Sample(id=sid, text_tokens=text, images=tuple(images)))
        except ProblemError as exc:
            raise ProblemError(exc.message, field=w, hint=exc.hint) from None
    try:
        return Batch(tuple(samples))
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


def _generated_ids(samples: list[Any]) -> dict[int, str]:
    """Ids for the samples that give none, by position: ``s<index>``, or when another sample of the
    batch has that id already, ``s<index>_2`` (``_3``, ...): a generated id never takes a given one."""
    missing = [k for k, s in enumerate(samples) if isinstance(s, Mapping) and "id" not in s]
    if not missing:
        return {}
    taken = {str(s["id"]) for s in samples if isinstance(s, Mapping) and isinstance(s.get("id"), (str, int))}
    out: dict[int, str] = {}
    for k in missing:
        name, n = f"s{k}", 1
        while name in taken:
            n += 1
            name = f"s{k}_{n}"
        taken.add(name)
        out[k] = name
    return out


_SAMPLE_KEYS = frozenset({"id", "text_tokens", "images", "videos"})
_IMAGE_KEYS = frozenset({"tokens", "frames", "tokens_per_frame"})


def _fast_images(items: Any, video: bool) -> list[Image] | None:
    """Images given by token counts (the common case), or None to take the general path."""
    if type(items) is not list:
        return None
    out = []
    for im in items:
        if type(im) is not dict or not im.keys() <= _IMAGE_KEYS:
            return None
        frames = im.get("frames", 1)
        per_frame = im.get("tokens_per_frame")
        tokens = im.get("tokens") if per_frame is None else per_frame
        if (
            type(frames) is not int
            or type(tokens) is not int
            or not 1 <= frames <= MAX_COUNT
            or not 1 <= tokens <= MAX_COUNT
            or (per_frame is not None and "tokens" in im)
        ):
            return None
        if video and per_frame is None and "frames" in im:
            tokens = max(1, -(-tokens // frames))  # for videos, 'tokens' is the clip's total
        out.append(Image(tokens=tokens, frames=frames))
    return out


def _sample_fast(s: Any) -> Sample | None:
    """A well-formed sample without pixel sizes, checked with few operations; None otherwise."""
    if type(s) is not dict or not s.keys() <= _SAMPLE_KEYS:
        return None
    sid = s.get("id")
    text = s.get("text_tokens", 0)
    if type(sid) is not str or not sid or type(text) is not int or not 0 <= text <= MAX_COUNT:
        return None
    images: list[Image] = []
    if "images" in s:
        got = _fast_images(s["images"], False)
        if got is None:
            return None
        images = got
    if "videos" in s:
        got = _fast_images(s["videos"], True)
        if got is None:
            return None
        images += got
    visual = sum(im.tokens * im.frames for im in images)
    if not 1 <= text + visual <= MAX_SAMPLE_TOKENS:
        return None
    return Sample.checked(sid, text, tuple(images), visual)


def _image(doc: Any, where: str, model: ModelSpec | None, video: bool = False) -> Image:
    doc = _obj(doc, where)
    _unknown(doc, {"tokens", "width", "height", "frames", "tokens_per_frame"}, where)
    frames = _get(doc, "frames", where, "int", 1)
    if frames < 1:
        raise ProblemError(f"must be >= 1, got {frames}", field=f"{where}.frames", hint="give the number of frames.")
    tokens = doc.get("tokens_per_frame", doc.get("tokens"))
    if tokens is not None:
        key = "tokens_per_frame" if "tokens_per_frame" in doc else "tokens"
        tokens = _get(doc, key, where, "int")
        if tokens < 1:
            raise ProblemError(
                f"must be >= 1, got {tokens}", field=f"{where}.{key}", hint="give the visual tokens per image or frame."
            )
        if video and key == "tokens" and "frames" in doc:
            # For videos, 'tokens' is the clip's total unless tokens_per_frame is given.
            tokens = max(1, -(-tokens // frames))
    else:
        if "width" not in doc or "height" not in doc:
            raise ProblemError(
                "needs 'tokens' or both 'width' and 'height'",
                field=where,
                hint='e.g. {"tokens": 576} or {"width": 448, "height": 448}.',
            )
        width = _get(doc, "width", where, "int")
        height = _get(doc, "height", where, "int")
        if width < 1 or height < 1:
            raise ProblemError(f"{width}x{height} is not a valid size", field=where, hint="give positive pixel sizes.")
        if model is None or model.vision is None:
            raise ProblemError(
                "gives pixels but the model has no vision encoder to turn them into tokens",
                field=where,
                hint="give 'tokens' instead, or use a multimodal model (e.g. --model-preset qwen2-vl-7b).",
            )
        tokens = model.vision.tokens_for_pixels(width, height)
    return Image(tokens=tokens, frames=frames)


# -- cluster ----------------------------------------------------------------------------------


def _gpu(doc: Any, where: str) -> tuple[GPUType, dict[str, float]]:
    catalog = gpu_catalog()
    if isinstance(doc, str):
        if doc not in catalog:
            raise ProblemError(
                f"unknown GPU type {shown(doc)}",
                field=where,
                hint=f"use one of {sorted(catalog)} or describe it with name, memory_bytes and peak_flops.",
            )
        entry = catalog[doc]
        return GPUType(doc, entry["memory_bytes"], entry["peak_flops"]), entry
    doc = _obj(doc, where)
    _unknown(doc, {"name", "memory_bytes", "peak_flops", "intra_bandwidth", "inter_bandwidth"}, where)
    name = _get(doc, "name", where, "str")
    base = dict(catalog.get(name, {}))
    for key, quantity in (
        ("memory_bytes", "memory"),
        ("peak_flops", "flops"),
        ("intra_bandwidth", "link"),
        ("inter_bandwidth", "link"),
    ):
        if key in doc:
            base[key] = _get(doc, key, where, quantity)
    for key in ("memory_bytes", "peak_flops"):
        if key not in base:
            raise ProblemError(
                "is required for a GPU type not in the catalog",
                field=f"{where}.{key}",
                hint=f"give it, or use a known type: {sorted(catalog)}.",
            )
    try:
        return GPUType(name, base["memory_bytes"], base["peak_flops"]), base
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


def cluster_from_json(doc: Any, where: str = "cluster") -> Cluster:
    doc = _obj(doc, where)
    allowed = {
        "name",
        "nodes",
        "gpus_per_node",
        "gpu",
        "intra_bandwidth",
        "inter_bandwidth",
        "intra_latency",
        "inter_latency",
        "tensor_parallel",
        "pipeline_parallel",
        "memory_reserve_bytes",
        "efficiency",
    }
    _unknown(doc, allowed, where)
    nodes_doc = doc.get("nodes")
    nodes: list[Node] = []
    defaults: dict[str, float] = {}
    if isinstance(nodes_doc, int) and not isinstance(nodes_doc, bool):
        if nodes_doc < 1:
            raise ProblemError(
                f"must be >= 1, got {shown(nodes_doc)}", field=f"{where}.nodes", hint="give the number of nodes."
            )
        if nodes_doc > MAX_NODES:
            raise ProblemError(
                f"{shown(nodes_doc)} nodes are more than the {MAX_NODES:,} this planner accepts",
                field=f"{where}.nodes",
                hint="describe at most that many nodes.",
            )
        per = _get(doc, "gpus_per_node", where, "int", 8)
        if not 1 <= per <= MAX_GPUS_PER_NODE:
            raise ProblemError(
                f"must be from 1 to {MAX_GPUS_PER_NODE}, got {per}",
                field=f"{where}.gpus_per_node",
                hint="give the GPUs per node, e.g. 8.",
            )
        gpu, defaults = _gpu(doc.get("gpu", "H100-SXM"), f"{where}.gpu")
        nodes = [Node(gpu, per)] * nodes_doc
    elif isinstance(nodes_doc, list) and nodes_doc:
        if "gpus_per_node" in doc:
            raise ProblemError(
                "goes with the shorthand 'nodes': K only",
                field=f"{where}.gpus_per_node",
                hint="give 'gpus' inside each node entry instead.",
            )
        for k, nd in enumerate(nodes_doc):
            w = f"{where}.nodes[{k}]"
            nd = _obj(nd, w)
            _unknown(nd, {"count", "gpus", "gpu"}, w)
            count = _get(nd, "count", w, "int", 1)
            gpus = _get(nd, "gpus", w, "int", 8)
            if count < 1 or gpus < 1:
                raise ProblemError(f"count {count} and gpus {gpus} must be >= 1", field=w, hint="give positive counts.")
            if gpus > MAX_GPUS_PER_NODE or len(nodes) + count > MAX_NODES:
                raise ProblemError(
                    f"at most {MAX_NODES:,} nodes of at most {MAX_GPUS_PER_NODE} GPUs are accepted",
                    field=w,
                    hint="describe a smaller cluster.",
                )
            gpu, entry = _gpu(nd.get("gpu", doc.get("gpu", "H100-SXM")), f"{w}.gpu")
            if not defaults:
                defaults = entry
            nodes.extend([Node(gpu, gpus)] * count)
    else:
        raise ProblemError(
            f"must be a node count or a non-empty list of nodes, got {shown(nodes_doc)}",
            field=f"{where}.nodes",
            hint='e.g. {"nodes": 8, "gpus_per_node": 8} or {"nodes": [{"count": 8, "gpus": 8, "gpu": "H100-SXM"}]}.',
        )

    def number(key: str, quantity: str, fallback: float | None) -> float:
        value = _get(doc, key, where, quantity, fallback)
        if value is None:
            raise ProblemError("is required for this GPU type", field=f"{where}.{key}", hint="give it in SI units.")
        return value

    try:
        return Cluster(
            nodes=tuple(nodes),
            intra_bandwidth=number("intra_bandwidth", "link", defaults.get("intra_bandwidth")),
            inter_bandwidth=number("inter_bandwidth", "link", defaults.get("inter_bandwidth")),
            intra_latency=number("intra_latency", "latency", 5e-6),
            inter_latency=number("inter_latency", "latency", 2e-5),
            tensor_parallel=_get(doc, "tensor_parallel", where, "int", 1),
            pipeline_parallel=_get(doc, "pipeline_parallel", where, "int", 1),
            name=_get(doc, "name", where, "str", "custom"),
            memory_reserve_bytes=number("memory_reserve_bytes", "reserve", 4e9),
            efficiency=number("efficiency", "efficiency", 0.5),
        )
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


# -- model ------------------------------------------------------------------------------------


def model_from_json(doc: Any, where: str = "model") -> ModelSpec:
    doc = _obj(doc, where)
    _unknown(doc, {"name", "llm", "vision", "training"}, where)
    llm_doc = _get(doc, "llm", where, "object")
    w = f"{where}.llm"
    _unknown(llm_doc, {"layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "parameters", "gated_mlp"}, w)
    try:
        llm = LanguageModel(
            layers=_get(llm_doc, "layers", w, "int"),
            hidden=_get(llm_doc, "hidden", w, "int"),
            heads=_get(llm_doc, "heads", w, "int"),
            kv_heads=_get(llm_doc, "kv_heads", w, "int", llm_doc.get("heads")),
            ffn_hidden=_get(llm_doc, "ffn_hidden", w, "int"),
            vocab=_get(llm_doc, "vocab", w, "int"),
            parameters=_get(llm_doc, "parameters", w, "parameters"),
            gated_mlp=_get(llm_doc, "gated_mlp", w, "bool", True),
        )
        vision = None
        if doc.get("vision") is not None:
            v = _get(doc, "vision", where, "object")
            wv = f"{where}.vision"
            _unknown(
                v,
                {
                    "layers",
                    "hidden",
                    "ffn_hidden",
                    "parameters",
                    "patch_size",
                    "merge_size",
                    "tokens_per_image",
                    "min_tokens",
                    "max_tokens",
                },
                wv,
            )
            vision = VisionEncoder(
                layers=_get(v, "layers", wv, "int"),
                hidden=_get(v, "hidden", wv, "int"),
                ffn_hidden=_get(v, "ffn_hidden", wv, "int"),
                parameters=_get(v, "parameters", wv, "parameters"),
                patch_size=_get(v, "patch_size", wv, "int", 14),
                merge_size=_get(v, "merge_size", wv, "int", 1),
                tokens_per_image=_get(v, "tokens_per_image", wv, "int", None),
                min_tokens=_get(v, "min_tokens", wv, "int", 4),
                max_tokens=_get(v, "max_tokens", wv, "int", 16384),
            )
        training = TrainingSetup()
        if doc.get("training") is not None:
            t = _get(doc, "training", where, "object")
            wt = f"{where}.training"
            _unknown(t, {"zero_stage", "recompute"}, wt)
            training = TrainingSetup(
                zero_stage=_get(t, "zero_stage", wt, "int", 1), recompute=_get(t, "recompute", wt, "str", "selective")
            )
        return ModelSpec(name=_get(doc, "name", where, "str", "custom"), llm=llm, vision=vision, training=training)
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


# -- profile ----------------------------------------------------------------------------------


def profile_from_json(doc: Any, where: str = "profile") -> CostProfile:
    doc = _obj(doc, where)
    _unknown(doc, {"time", "comm", "capacity_tokens_per_rank", "speed_by_gpu", "source"}, where)
    t = _get(doc, "time", where, "object")
    wt = f"{where}.time"
    _unknown(
        t,
        {
            "quadratic",
            "linear",
            "sample_constant",
            "group_constant",
            "vision_linear",
            "vision_quadratic",
            "sample_step",
            "step_constant",
        },
        wt,
    )
    c = _get(doc, "comm", where, "object")
    wc = f"{where}.comm"
    _unknown(
        c,
        {
            "scheme",
            "bytes_per_token",
            "bandwidth_bytes_per_s",
            "latency_s",
            "messages_per_step",
            "messages_fixed",
            "overlap_with_attention",
            "group_messages",
            "padded_bytes",
        },
        wc,
    )
    bw = _get(c, "bandwidth_bytes_per_s", wc, "object")
    wb = f"{wc}.bandwidth_bytes_per_s"
    _unknown(bw, {"intra", "inter"}, wb)
    if "intra" not in bw or "inter" not in bw:
        raise ProblemError(
            "needs both 'intra' and 'inter'", field=wb, hint="give a number or a table by group size for each."
        )
    lat = _get(c, "latency_s", wc, "object", {})
    _unknown(lat, {"intra", "inter"}, f"{wc}.latency_s")
    group_messages = _get(c, "group_messages", wc, "object", {})
    _unknown(group_messages, {"per_step", "fixed"}, f"{wc}.group_messages")
    wcap = f"{where}.capacity_tokens_per_rank"
    cap = doc.get("capacity_tokens_per_rank")
    cap_by_gpu: dict[str, float] = {}
    if isinstance(cap, Mapping):
        if "default" not in cap:
            raise ProblemError(
                "a table needs a 'default' entry", field=wcap, hint='e.g. {"default": 16384, "A100-40GB": 8192}.'
            )
        cap_by_gpu = {str(k): _within(v, "capacity", f"{wcap}.{k}") for k, v in cap.items() if k != "default"}
        cap, wcap = cap["default"], f"{wcap}.default"
    if cap is None:
        raise ProblemError("is required", field=wcap, hint="give the tokens one rank holds in a micro-batch.")
    speed = {
        str(k): _within(v, "speed", f"{where}.speed_by_gpu.{k}")
        for k, v in _get(doc, "speed_by_gpu", where, "object", {}).items()
    }

    try:
        return CostProfile(
            quadratic=_get(t, "quadratic", wt, "per_token2"),
            linear=_get(t, "linear", wt, "per_token"),
            sample_constant=_get(t, "sample_constant", wt, "seconds"),
            group_constant=_get(t, "group_constant", wt, "seconds"),
            vision_linear=_get(t, "vision_linear", wt, "per_token", 0.0),
            vision_quadratic=_get(t, "vision_quadratic", wt, "per_token2", 0.0),
            scheme=_get(c, "scheme", wc, "str"),
            bytes_per_token=_get(c, "bytes_per_token", wc, "bytes_per_token"),
            intra_bandwidth=_bandwidth(bw["intra"], f"{wb}.intra"),
            inter_bandwidth=_bandwidth(bw["inter"], f"{wb}.inter"),
            intra_latency=_get(lat, "intra", f"{wc}.latency_s", "latency", 0.0),
            inter_latency=_get(lat, "inter", f"{wc}.latency_s", "latency", 0.0),
            messages_per_step=_get(c, "messages_per_step", wc, "messages", 0.0),
            messages_fixed=_get(c, "messages_fixed", wc, "messages", 0.0),
            overlap_with_attention=_get(c, "overlap_with_attention", wc, "bool", False),
            sample_step=_get(t, "sample_step", wt, "seconds", 0.0),
            step_constant=_get(t, "step_constant", wt, "seconds", 0.0),
            group_messages_per_step=_get(group_messages, "per_step", f"{wc}.group_messages", "messages", 0.0),
            group_messages_fixed=_get(group_messages, "fixed", f"{wc}.group_messages", "messages", 0.0),
            padded_bytes=_get(c, "padded_bytes", wc, "bool", False),
            capacity_tokens_per_rank=_within(cap, "capacity", wcap),
            capacity_by_gpu=cap_by_gpu,
            speed_by_gpu=speed,
            source=_get(doc, "source", where, "str", "given"),
        )
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


def _bandwidth(doc: Any, where: str) -> Bandwidth:
    """A bandwidth, one number or a table by group size, with every number within its range."""
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            _within(value, "bandwidth", f"{where}.{key}")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        _within(doc, "bandwidth", where)
    return Bandwidth.from_json(doc, where)


# -- options ----------------------------------------------------------------------------------


def options_from_json(doc: Any, where: str = "options") -> PlanOptions:
    if doc is None:
        return PlanOptions()
    doc = _obj(doc, where)
    fields = {spec.name: spec.kind for spec in OPTION_SPECS}
    _unknown(doc, set(fields), where)
    kwargs = {k: _get(doc, k, where, kind) for k, kind in fields.items() if doc.get(k) is not None}
    try:
        return PlanOptions(**kwargs)
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


# -- a whole request --------------------------------------------------------------------------

ENVELOPE = ("wait", "cache")
"""Members of a ``POST /v1/plans`` body that say how to answer (booleans), accepted in a request document
so that a body saved to a file reads as one."""


def problem_from_json(doc: Any, overrides: Mapping[str, Any] | None = None) -> Problem:
    """Build a problem from a request document (see the module docstring)."""
    doc = _obj(doc, "request")
    _unknown(
        doc,
        {
            "batch",
            "cluster",
            "cluster_preset",
            "model",
            "model_preset",
            "profile",
            "options",
            "existing_groups",
            *ENVELOPE,
        },
        "request",
    )
    for (
        key
    ) in ENVELOPE:  # how the service answers; checked as strictly as the rest, though the plan does not depend on them
        _get(doc, key, "", "bool", True)
    if "cluster" in doc and "cluster_preset" in doc:
        raise ProblemError(
            "give either 'cluster' or 'cluster_preset', not both", field="cluster_preset", hint="drop one of them."
        )
    if "model" in doc and "model_preset" in doc:
        raise ProblemError(
            "give either 'model' or 'model_preset', not both", field="model_preset", hint="drop one of them."
        )
    if doc.get("cluster") is not None:
        cluster = cluster_from_json(doc["cluster"])
    else:
        name = _get(doc, "cluster_preset", "", "str", "h100-8x8")
        cluster = cluster_from_json(load_preset("clusters", name, "cluster_preset"))
    if doc.get("model") is not None:
        model = model_from_json(doc["model"])
    else:
        name = _get(doc, "model_preset", "", "str", "llama3-8b")
        model = model_from_json(load_preset("models", name, "model_preset"))
    batch = batch_from_json(_get(doc, "batch", "", "object"), model)
    profile = profile_from_json(doc["profile"]) if doc.get("profile") is not None else None
    options = options_from_json(doc.get("options"))
    if overrides:
        from dataclasses import replace

        options = replace(options, **overrides)
    groups = existing_groups_from_json(doc.get("existing_groups"), cluster.domain_size)
    return Problem(cluster=cluster, model=model, batch=batch, options=options, profile=profile, existing_groups=groups)


def existing_groups_from_json(
    doc: Any, domain_size: int, where: str = "existing_groups"
) -> tuple[tuple[int, ...], ...]:
    """The rank groups a job already has, as a set: each group's ranks sorted, the groups sorted, a group
    listed twice kept once (it is the same communicator), so that the same groups in any order are the
    same problem (and the same request hash). None means none."""
    if doc is None:
        return ()
    if not isinstance(doc, list):
        raise ProblemError(
            f"must be a list of rank lists, got {type(doc).__name__}",
            field=where,
            hint="e.g. [[0, 1], [2, 3], [0, 1, 2, 3]].",
        )
    out: set[tuple[int, ...]] = set()
    for k, g in enumerate(doc):
        w = f"{where}[{k}]"
        if not isinstance(g, list) or not g or not all(isinstance(r, int) and not isinstance(r, bool) for r in g):
            raise ProblemError(
                "must be a non-empty list of integer ranks",
                field=w,
                hint="list the global ranks of one group as JSON integers, e.g. [0, 1].",
            )
        bad = [r for r in g if not 0 <= r < domain_size]
        if bad:
            raise ProblemError(
                f"rank {shown(bad[0])} is outside 0..{domain_size - 1}",
                field=w,
                hint="use ranks of the data/context domain of this cluster.",
            )
        if len(set(g)) != len(g):
            raise ProblemError("repeats a rank", field=w, hint="list each rank once.")
        out.add(tuple(sorted(g)))
    return tuple(sorted(out))


def read_json_file(path: str | Path, what: str) -> Any:
    """Read a JSON file, turning I/O and syntax errors into a ProblemError naming the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProblemError(f"cannot read {p}: {exc.strerror or exc}", field=what, hint="check the path.") from None
    except UnicodeDecodeError as exc:
        raise ProblemError(
            f"{p} is not UTF-8 text (byte {exc.start})", field=what, hint="save the file as UTF-8 JSON."
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProblemError(
            f"{p} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            field=what,
            hint="fix the JSON syntax.",
        ) from None
    except RecursionError:
        raise ProblemError(
            f"{p} nests arrays or objects too deeply to read",
            field=what,
            hint="input documents are a few levels deep; check the file.",
        ) from None
    except ValueError as exc:  # e.g. an integer of thousands of digits
        raise ProblemError(
            f"{p} has a value that cannot be read: {exc}", field=what, hint="check the numbers in the file."
        ) from None
    bad = first_bad_text(doc)
    if bad is not None:
        raise ProblemError(f"{p}: {bad[0]} {bad[1]}", field=what, hint=TEXT_HINT)
    return doc
