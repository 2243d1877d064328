"""Input documents (JSON objects) to domain objects, with errors that name the field.

The same documents are the ``dhp plan`` input files and the parts of a ``POST /v1/plans`` body:
``batch``, ``cluster`` (or ``cluster_preset``), ``model`` (or ``model_preset``), ``profile`` and
``options``. Every function here raises :class:`~optimizer.errors.ProblemError` naming the field
path (``batch.samples[3].images[0].tokens``) and saying how to fix it. The fields an object allows,
what each must be and what it is when left out are the documents' definitions
(:mod:`optimizer.problem.definitions`, :data:`optimizer.problem.options.OPTIONS`); what one field
cannot say (a field that goes with another, a size named as a whole, a preset that exists) is
checked here, and what the domain types check (a divisor, a sample's length) by them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.errors import ProblemError
from optimizer.presets import gpu_catalog, load_preset
from optimizer.problem.batch import MAX_SAMPLE_TOKENS, Batch, Image, Sample
from optimizer.problem.checks import Range, shown
from optimizer.problem.cluster import Cluster, GPUType, Node
from optimizer.problem.definitions import (
    BANDWIDTHS,
    BATCH,
    CLUSTER,
    COMM,
    GPU,
    GROUP_MESSAGES,
    IMAGE,
    LANGUAGE_MODEL,
    LATENCIES,
    MAX_NODES,
    MODEL,
    NODE,
    PROFILE,
    REQUEST,
    SAMPLE,
    TIME,
    TRAINING,
    VISION_ENCODER,
)
from optimizer.problem.fields import REQUIRED, Document, FieldSpec
from optimizer.problem.model import LanguageModel, ModelSpec, TrainingSetup, VisionEncoder
from optimizer.problem.options import OPTION_SPECS, OPTIONS, CheckedOptions, PlanOptions
from optimizer.problem.problem import Problem
from optimizer.problem.text import HINT as TEXT_HINT
from optimizer.problem.text import first_bad_text

_DEFAULT = object()


def _unbounded(spec: FieldSpec) -> FieldSpec:
    """``spec`` read as a count within the counts' bound only: the caller checks its range, naming more than the
    field (an image's size, a node group)."""
    return replace(spec, range=Range(unit=spec.unit))


_WIDTH, _HEIGHT = _unbounded(IMAGE["width"]), _unbounded(IMAGE["height"])
_NODE_COUNT, _NODE_GPUS = _unbounded(NODE["count"]), _unbounded(NODE["gpus"])


def _obj(doc: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(doc, Mapping):
        raise ProblemError(
            f"must be a JSON object, got {type(doc).__name__}",
            field=where,
            hint="see examples/ for the document shapes.",
        )
    return doc


def _open(doc: Any, document: Document, where: str) -> Mapping[str, Any]:
    """``doc`` once it is a JSON object of no other fields than ``document``'s."""
    doc = _obj(doc, where)
    _unknown(doc, document.names, where)
    return doc


def _unknown(doc: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
    extra = sorted(set(doc) - allowed)
    if extra:
        raise ProblemError(f"unknown field(s) {extra}", field=where, hint=f"allowed fields are {sorted(allowed)}.")


def _get(doc: Mapping[str, Any], spec: FieldSpec, where: str, default: Any = _DEFAULT) -> Any:
    """The value of field ``spec`` of ``doc`` (at path ``where``), read by its definition; when left out or null,
    its default, or ``default`` for a field whose default the caller works out."""
    path = f"{where}.{spec.name}" if where else spec.name
    value = doc.get(spec.name)
    if value is None:
        value = spec.default if default is _DEFAULT else default
        if value is REQUIRED:
            raise ProblemError("is required", field=path, hint=f"add '{spec.name}' ({spec.what}).")
        return value
    return spec.read(value, path)


def _fields(doc: Mapping[str, Any], document: Document, where: str, **defaults: Any) -> dict[str, Any]:
    """Every field of ``document`` read from ``doc`` (``defaults``: the values of those left out whose default the
    caller works out)."""
    return {spec.name: _get(doc, spec, where, defaults.get(spec.name, _DEFAULT)) for spec in document.fields}


def _within(spec: FieldSpec, value: Any, path: str) -> Any:
    """``value`` as given, once it is a number of ``spec``'s range."""
    assert spec.range is not None
    spec.range.check(value, path, spec.hint)
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
    doc = _open(doc, BATCH, where)
    samples_doc = _get(doc, BATCH["samples"], where)
    generated = _generated_ids(samples_doc)
    samples = []
    for k, s in enumerate(samples_doc):
        fast = _sample_fast(s)
        if fast is not None:
            samples.append(fast)
            continue
        # The general path: slower, and its errors name the exact field.
        w = f"{where}.samples[{k}]"
        s = _open(s, SAMPLE, w)
        sid = s["id"] if "id" in s else generated[k]
        if isinstance(sid, int) and not isinstance(sid, bool):
            sid = str(sid)
        if not isinstance(sid, str) or not sid:
            raise ProblemError(f"must be a non-empty string, got {shown(sid)}", field=f"{w}.id", hint=_ID.hint)
        text = _get(s, _TEXT, w)
        images = [_image(im, f"{w}.images[{i}]", model) for i, im in enumerate(_get(s, SAMPLE["images"], w))]
        images += [_image(v, f"{w}.videos[{i}]", model, video=True) for i, v in enumerate(_get(s, SAMPLE["videos"], w))]
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


_ID, _TEXT = SAMPLE["id"], SAMPLE["text_tokens"]
_FRAMES, _TOKENS, _PER_FRAME = IMAGE["frames"], IMAGE["tokens"], IMAGE["tokens_per_frame"]
# The fast path below checks what the definitions say with few operations; these are their bounds.
_SAMPLE_KEYS = SAMPLE.names
_IMAGE_KEYS = frozenset({"tokens", "frames", "tokens_per_frame"})
"""The image fields of the fast path: visual tokens given as counts (pixel sizes take the general path)."""
_TEXT_LOW, _TEXT_HIGH = _TEXT.count_bounds
_FRAMES_LOW, _FRAMES_HIGH = _FRAMES.count_bounds
_TOKENS_LOW, _TOKENS_HIGH = _TOKENS.count_bounds
if _PER_FRAME.bounds != _TOKENS.bounds:
    raise AssertionError("the fast path reads tokens and tokens_per_frame by one range")


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
            or not _FRAMES_LOW <= frames <= _FRAMES_HIGH
            or not _TOKENS_LOW <= tokens <= _TOKENS_HIGH
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
    if type(sid) is not str or not sid or type(text) is not int or not _TEXT_LOW <= text <= _TEXT_HIGH:
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
    doc = _open(doc, IMAGE, where)
    frames = _get(doc, _FRAMES, where)
    tokens = doc.get("tokens_per_frame", doc.get("tokens"))
    if tokens is not None:
        spec = _PER_FRAME if "tokens_per_frame" in doc else _TOKENS
        tokens = _get(doc, spec, where, REQUIRED)
        if video and spec is _TOKENS and "frames" in doc:
            # For videos, 'tokens' is the clip's total unless tokens_per_frame is given.
            tokens = max(1, -(-tokens // frames))
    else:
        if "width" not in doc or "height" not in doc:
            raise ProblemError(
                "needs 'tokens' or both 'width' and 'height'",
                field=where,
                hint='e.g. {"tokens": 576} or {"width": 448, "height": 448}.',
            )
        width = _get(doc, _WIDTH, where, REQUIRED)
        height = _get(doc, _HEIGHT, where, REQUIRED)
        if width < 1 or height < 1:  # one refusal for the size, naming the image
            raise ProblemError(f"{width}x{height} is not a valid size", field=where, hint=_WIDTH.hint)
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
    doc = _open(doc, GPU, where)
    name = _get(doc, GPU["name"], where)
    base = dict(catalog.get(name, {}))
    for key in ("memory_bytes", "peak_flops", "intra_bandwidth", "inter_bandwidth"):
        if key in doc:
            base[key] = _get(doc, GPU[key], where, REQUIRED)
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
    doc = _open(doc, CLUSTER, where)
    nodes_doc = doc.get("nodes")
    nodes: list[Node] = []
    defaults: dict[str, float] = {}
    gpu_default = CLUSTER["gpu"].default
    if isinstance(nodes_doc, int) and not isinstance(nodes_doc, bool):
        if nodes_doc < 1:
            raise ProblemError(
                f"must be >= 1, got {shown(nodes_doc)}", field=f"{where}.nodes", hint=CLUSTER["nodes"].hint
            )
        if nodes_doc > MAX_NODES:
            raise ProblemError(
                f"{shown(nodes_doc)} nodes are more than the {MAX_NODES:,} this planner accepts",
                field=f"{where}.nodes",
                hint="describe at most that many nodes.",
            )
        per = _get(doc, CLUSTER["gpus_per_node"], where)
        gpu, defaults = _gpu(doc.get("gpu", gpu_default), f"{where}.gpu")
        nodes = [Node(gpu, per)] * nodes_doc
    elif isinstance(nodes_doc, list) and nodes_doc:
        if "gpus_per_node" in doc:
            raise ProblemError(
                "goes with the shorthand 'nodes': K only",
                field=f"{where}.gpus_per_node",
                hint="give 'gpus' inside each node entry instead.",
            )
        max_gpus = NODE["gpus"].count_bounds[1]
        for k, nd in enumerate(nodes_doc):
            w = f"{where}.nodes[{k}]"
            nd = _open(nd, NODE, w)
            count = _get(nd, _NODE_COUNT, w)
            gpus = _get(nd, _NODE_GPUS, w)
            if count < 1 or gpus < 1:
                raise ProblemError(f"count {count} and gpus {gpus} must be >= 1", field=w, hint=_NODE_COUNT.hint)
            if gpus > max_gpus or len(nodes) + count > MAX_NODES:
                raise ProblemError(
                    f"at most {MAX_NODES:,} nodes of at most {max_gpus} GPUs are accepted",
                    field=w,
                    hint="describe a smaller cluster.",
                )
            gpu, entry = _gpu(nd.get("gpu", doc.get("gpu", gpu_default)), f"{w}.gpu")
            if not defaults:
                defaults = entry
            nodes.extend([Node(gpu, gpus)] * count)
    else:
        raise ProblemError(
            f"must be a node count or a non-empty list of nodes, got {shown(nodes_doc)}",
            field=f"{where}.nodes",
            hint='e.g. {"nodes": 8, "gpus_per_node": 8} or {"nodes": [{"count": 8, "gpus": 8, "gpu": "H100-SXM"}]}.',
        )

    def catalog(key: str) -> float:
        value = _get(doc, CLUSTER[key], where, defaults.get(key))
        if value is None:
            raise ProblemError("is required for this GPU type", field=f"{where}.{key}", hint="give it in SI units.")
        return value

    def given(key: str) -> Any:
        return _get(doc, CLUSTER[key], where)

    try:
        return Cluster(
            nodes=tuple(nodes),
            intra_bandwidth=catalog("intra_bandwidth"),
            inter_bandwidth=catalog("inter_bandwidth"),
            intra_latency=given("intra_latency"),
            inter_latency=given("inter_latency"),
            tensor_parallel=given("tensor_parallel"),
            pipeline_parallel=given("pipeline_parallel"),
            name=given("name"),
            memory_reserve_bytes=given("memory_reserve_bytes"),
            efficiency=given("efficiency"),
        )
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


# -- model ------------------------------------------------------------------------------------


def model_from_json(doc: Any, where: str = "model") -> ModelSpec:
    doc = _open(doc, MODEL, where)
    w = f"{where}.llm"
    llm_doc = _open(_get(doc, MODEL["llm"], where), LANGUAGE_MODEL, w)
    try:
        llm = LanguageModel(**_fields(llm_doc, LANGUAGE_MODEL, w, kv_heads=llm_doc.get("heads")))
        vision = None
        if doc.get("vision") is not None:
            wv = f"{where}.vision"
            v = _open(_get(doc, MODEL["vision"], where), VISION_ENCODER, wv)
            vision = VisionEncoder(**_fields(v, VISION_ENCODER, wv))
        training = TrainingSetup()
        if doc.get("training") is not None:
            wt = f"{where}.training"
            t = _open(_get(doc, MODEL["training"], where), TRAINING, wt)
            training = TrainingSetup(**_fields(t, TRAINING, wt))
        return ModelSpec(name=_get(doc, MODEL["name"], where), llm=llm, vision=vision, training=training)
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


# -- profile ----------------------------------------------------------------------------------


def profile_from_json(doc: Any, where: str = "profile") -> CostProfile:
    if isinstance(doc, str) and doc.startswith("learned:"):
        raise ProblemError(
            f"{doc!r} names a profile the planning service learned; only the service can read it",
            field=where,
            hint=(
                "plan through the service (POST /v1/plans with this profile), or save the 'profile' member of "
                f"GET /v1/profiles/{doc.removeprefix('learned:')} to a file and give that file as the profile."
            ),
        )
    doc = _open(doc, PROFILE, where)
    wt, wc = f"{where}.time", f"{where}.comm"
    t = _open(_get(doc, PROFILE["time"], where), TIME, wt)
    c = _open(_get(doc, PROFILE["comm"], where), COMM, wc)
    wb = f"{wc}.bandwidth_bytes_per_s"
    bw = _open(_get(c, COMM["bandwidth_bytes_per_s"], wc), BANDWIDTHS, wb)
    if "intra" not in bw or "inter" not in bw:
        raise ProblemError(
            "needs both 'intra' and 'inter'", field=wb, hint="give a number or a table by group size for each."
        )
    wl, wg = f"{wc}.latency_s", f"{wc}.group_messages"
    lat = _open(_get(c, COMM["latency_s"], wc, {}), LATENCIES, wl)
    group_messages = _open(_get(c, COMM["group_messages"], wc, {}), GROUP_MESSAGES, wg)
    capacity = PROFILE["capacity_tokens_per_rank"]
    wcap = f"{where}.capacity_tokens_per_rank"
    cap = doc.get("capacity_tokens_per_rank")
    cap_by_gpu: dict[str, float] = {}
    if isinstance(cap, Mapping):
        if "default" not in cap:
            raise ProblemError(
                "a table needs a 'default' entry", field=wcap, hint='e.g. {"default": 16384, "A100-40GB": 8192}.'
            )
        cap_by_gpu = {str(k): _within(capacity, v, f"{wcap}.{k}") for k, v in cap.items() if k != "default"}
        cap, wcap = cap["default"], f"{wcap}.default"
    if cap is None:
        raise ProblemError("is required", field=wcap, hint="give the tokens one rank holds in a micro-batch.")
    speed_spec = PROFILE["speed_by_gpu"]
    assert speed_spec.item is not None
    speed = {
        str(k): _within(speed_spec.item, v, f"{where}.speed_by_gpu.{k}")
        for k, v in _get(doc, speed_spec, where, {}).items()
    }
    time, comm = _fields(t, TIME, wt), _fields(c, COMM, wc, latency_s=None, group_messages=None)
    latency, messages = _fields(lat, LATENCIES, wl), _fields(group_messages, GROUP_MESSAGES, wg)
    try:
        return CostProfile(
            **time,
            scheme=comm["scheme"],
            bytes_per_token=comm["bytes_per_token"],
            ulysses_bytes_per_token=comm["ulysses_bytes_per_token"],
            intra_bandwidth=_bandwidth(bw["intra"], f"{wb}.intra"),
            inter_bandwidth=_bandwidth(bw["inter"], f"{wb}.inter"),
            intra_latency=latency["intra"],
            inter_latency=latency["inter"],
            messages_per_step=comm["messages_per_step"],
            messages_fixed=comm["messages_fixed"],
            overlap_with_attention=comm["overlap_with_attention"],
            group_messages_per_step=messages["per_step"],
            group_messages_fixed=messages["fixed"],
            padded_bytes=comm["padded_bytes"],
            capacity_tokens_per_rank=_within(capacity, cap, wcap),
            capacity_by_gpu=cap_by_gpu,
            speed_by_gpu=speed,
            source=_get(doc, PROFILE["source"], where),
        )
    except ProblemError as exc:
        raise _rewhere(exc, where) from None


def _bandwidth(doc: Any, where: str) -> Bandwidth:
    """A bandwidth, one number or a table by group size, with every number within its range."""
    spec = BANDWIDTHS["intra"]
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            _within(spec, value, f"{where}.{key}")
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        _within(spec, doc, where)
    return Bandwidth.from_json(doc, where)


# -- options ----------------------------------------------------------------------------------


def options_from_json(doc: Any, where: str = "options") -> PlanOptions:
    """The planner options of an options document; one its sender already checked (:class:`CheckedOptions`)
    as they were read then."""
    if doc is None:
        return PlanOptions()
    if isinstance(doc, CheckedOptions):
        return doc.options
    doc = _open(doc, OPTIONS, where)
    return PlanOptions.checked(
        **{spec.name: _get(doc, spec, where) for spec in OPTION_SPECS if doc.get(spec.name) is not None}
    )


# -- a whole request --------------------------------------------------------------------------

ENVELOPE = ("wait", "cache")
"""Members of a ``POST /v1/plans`` body that say how to answer (booleans), accepted in a request document
so that a body saved to a file reads as one."""


def problem_from_json(doc: Any, overrides: Mapping[str, Any] | None = None) -> Problem:
    """Build a problem from a request document (see the module docstring)."""
    doc = _open(doc, REQUEST, "request")
    for (
        key
    ) in ENVELOPE:  # how the service answers; checked as strictly as the rest, though the plan does not depend on them
        _get(doc, REQUEST[key], "")
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
        name = _get(doc, REQUEST["cluster_preset"], "")
        cluster = cluster_from_json(load_preset("clusters", name, "cluster_preset"))
    if doc.get("model") is not None:
        model = model_from_json(doc["model"])
    else:
        name = _get(doc, REQUEST["model_preset"], "")
        model = model_from_json(load_preset("models", name, "model_preset"))
    batch = batch_from_json(_get(doc, REQUEST["batch"], ""), model)
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
