"""The input documents, one definition each: batch, cluster, model and profile (the planner options are
defined with :class:`~optimizer.problem.options.PlanOptions`).

Each document is a :class:`~optimizer.problem.fields.Document` of :class:`~optimizer.problem.fields.FieldSpec`:
the reader (:mod:`optimizer.problem.documents`), the service's request schema and the command-line flags
all read them here. Every number is a quantity with a range (the same rule as the planner options'
bounds): wide enough for any real machine or measurement, narrow enough that no value turns a plan or an
error message absurd (a step of 1e300 s, a rank count of 300 digits).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from optimizer.problem.batch import MAX_SAMPLE_TOKENS
from optimizer.problem.checks import Range
from optimizer.problem.fields import Document, FieldSpec
from optimizer.problem.options import CP_SCHEMES, OPTIONS

MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024


def _number(name: str, help: str, span: Range, hint: str, **more: Any) -> FieldSpec:
    return FieldSpec(name, "number", help, hint, range=span, **more)


def _count(name: str, help: str, hint: str, low: int = 1, unit: str | None = None, **more: Any) -> FieldSpec:
    return FieldSpec(name, "int", help, hint, range=Range(low, more.pop("high", None), unit), **more)


def _document(name: str, help: str, document: Document, **more: Any) -> FieldSpec:
    return FieldSpec(name, "document", help, document=document, **more)


# -- quantities shared by several fields -----------------------------------------------------------

LINK = Range(1e6, 1e15, "bytes/s")
LINK_HINT = "give bytes per second per GPU, e.g. 4.5e11 inside a node or 5e10 between nodes."
LATENCY = Range(0, 10, "seconds")
LATENCY_HINT = "give the latency of one message in seconds, e.g. 5e-6 inside a node or 2e-5 between nodes."
PARAMETERS = Range(1, 1e15, "parameters")
PARAMETERS_HINT = "give the parameter count, e.g. 8.03e9."
PER_TOKEN2 = Range(0, 1, "seconds per token squared")
PER_TOKEN2_HINT = "give the measured coefficient in SI units, e.g. 1.2e-9."
PER_TOKEN = Range(0, 10, "seconds per token")
PER_TOKEN_HINT = "give the measured coefficient in SI units, e.g. 8.6e-5."
SECONDS = Range(0, 86_400, "seconds")
SECONDS_HINT = "give the measured time in seconds, e.g. 3.4e-3."
MESSAGES = Range(0, 1e6, "messages")
MESSAGES_HINT = "give the message count, e.g. 2."
BANDWIDTH = Range(1, 1e15, "bytes/s")
BANDWIDTH_HINT = "give the measured bytes per second (with comm.bytes_per_token in the same bytes), e.g. 4.5e11."


# -- batch ------------------------------------------------------------------------------------------


def _visual(what: str, tokens_help: str) -> Document:
    tokens_hint = "give the visual tokens per image or frame."
    return Document(
        what,
        f"One {what.lower()} of a sample: its visual tokens, or its pixel size for a model with a vision encoder.",
        (
            _count("tokens", tokens_help, tokens_hint, unit="tokens", derived="from width and height"),
            _count("frames", "frames of the same size (1 for a still image)", "give the number of frames.", default=1),
            _count("tokens_per_frame", "visual tokens of each frame", tokens_hint, unit="tokens", default=None),
            _count(
                "width",
                "width in pixels (with height, for a model with a vision encoder)",
                "give positive pixel sizes.",
                unit="pixels",
                derived="none: tokens give the image",
                nullable=False,
            ),
            _count(
                "height",
                "height in pixels (with width)",
                "give positive pixel sizes.",
                unit="pixels",
                derived="none: tokens give the image",
                nullable=False,
            ),
        ),
    )


IMAGE = _visual("Image", "visual tokens of the image (of each frame, when it has several)")
VIDEO = _visual("Video", "visual tokens of the whole clip, spread over its frames")
SAMPLE = Document(
    "Sample",
    "One training sample: its sequence is its text tokens and the visual tokens of its images and videos.",
    (
        FieldSpec(
            "id",
            "str",
            "the sample's id, unique in the batch; an integer is read as its decimal text",
            "give every sample a unique id.",
            derived="s<index> (s<index>_2, ... when a given id has that name)",
            nullable=False,
            min_length=1,
            either=FieldSpec("id", "int", "an integer id", "give every sample a unique id."),
        ),
        _count("text_tokens", "text tokens of the sample", "give the number of text tokens.", 0, "tokens", default=0),
        FieldSpec("images", "list", "the sample's images", default=(), item=_document("image", "an image", IMAGE)),
        FieldSpec("videos", "list", "the sample's videos", default=(), item=_document("video", "a video", VIDEO)),
    ),
)
BATCH = Document(
    "Batch",
    "A global batch: the samples to plan (at most the service's limit).",
    (
        FieldSpec(
            "samples", "list", "the samples, at least one", min_length=1, item=_document("sample", "a sample", SAMPLE)
        ),
    ),
)


# -- cluster ----------------------------------------------------------------------------------------

GPU = Document(
    "GPU",
    "A GPU type; a name of the GPU catalog (dhp presets) gives the numbers left out.",
    (
        FieldSpec("name", "str", "the GPU type's name, e.g. H100-SXM", "name the GPU type, e.g. 'H100'.", min_length=1),
        _number(
            "memory_bytes",
            "device memory",
            Range(1e6, 1e15, "bytes"),
            "give the device memory in bytes, e.g. 80e9.",
            derived="the catalog entry of name",
            nullable=False,
        ),
        _number(
            "peak_flops",
            "peak dense bf16 throughput",
            Range(1e6, 1e19, "FLOP/s"),
            "give the peak dense bf16 FLOP/s, e.g. 989e12.",
            derived="the catalog entry of name",
            nullable=False,
        ),
        _number(
            "intra_bandwidth",
            "per-GPU bandwidth inside a node",
            LINK,
            LINK_HINT,
            derived="the catalog entry of name",
            nullable=False,
        ),
        _number(
            "inter_bandwidth",
            "per-GPU bandwidth between nodes",
            LINK,
            LINK_HINT,
            derived="the catalog entry of name",
            nullable=False,
        ),
    ),
)
GPU_TYPE = FieldSpec(
    "gpu",
    "str",
    "the GPU type: a name of the GPU catalog (dhp presets), or a description",
    "use a GPU type of the catalog or describe it with name, memory_bytes and peak_flops.",
    default="H100-SXM",
    nullable=False,
    either=_document("gpu", "a GPU type not in the catalog, or a catalog entry with other numbers", GPU),
)
NODE = Document(
    "NodeGroup",
    "Nodes alike: count nodes of gpus GPUs of one type.",
    (
        _count("count", "nodes in the group", "give positive counts.", unit="nodes", high=MAX_NODES, default=1),
        _count("gpus", "GPUs per node", "give positive counts.", unit="GPUs", high=MAX_GPUS_PER_NODE, default=8),
        replace(GPU_TYPE, default=None, derived="the cluster's gpu"),
    ),
)
CLUSTER = Document(
    "Cluster",
    'A cluster: its nodes and links, and the fixed tensor and pipeline layout; or the shorthand {"nodes": K, '
    '"gpus_per_node": G}.',
    (
        FieldSpec("name", "str", "the cluster's name in plan listings", default="custom"),
        _count(
            "nodes",
            "the nodes: their count (each of gpus_per_node GPUs of type gpu), or a list of node groups",
            "give the number of nodes.",
            unit="nodes",
            high=MAX_NODES,
            nullable=False,
            flag="--nodes",
            either=FieldSpec(
                "nodes", "list", "node groups", min_length=1, item=_document("node", "a node group", NODE)
            ),
        ),
        _count(
            "gpus_per_node",
            "GPUs per node, with nodes given as a count",
            "give the GPUs per node, e.g. 8.",
            unit="GPUs",
            high=MAX_GPUS_PER_NODE,
            default=8,
            flag="--gpus-per-node",
        ),
        replace(GPU_TYPE, flag="--gpu"),
        _number(
            "intra_bandwidth",
            "per-GPU bandwidth inside a node (NVLink class)",
            LINK,
            LINK_HINT,
            derived="the GPU type's catalog entry",
        ),
        _number(
            "inter_bandwidth",
            "per-GPU bandwidth between nodes (network)",
            LINK,
            LINK_HINT,
            derived="the GPU type's catalog entry",
        ),
        _number("intra_latency", "latency of one message inside a node", LATENCY, LATENCY_HINT, default=5e-6),
        _number("inter_latency", "latency of one message between nodes", LATENCY, LATENCY_HINT, default=2e-5),
        _count(
            "tensor_parallel",
            "tensor-parallel size (inside a node)",
            "use 1 when tensor parallelism is off.",
            default=1,
        ),
        _count("pipeline_parallel", "pipeline-parallel size", "use 1 when pipeline parallelism is off.", default=1),
        _number(
            "memory_reserve_bytes",
            "memory per GPU kept back for the framework, the communicators and fragmentation",
            Range(0, 1e15, "bytes"),
            "give the bytes per GPU kept back for the framework, e.g. 4e9.",
            default=4e9,
        ),
        _number(
            "efficiency",
            "fraction of peak throughput that dense kernels reach (model FLOPs utilisation)",
            Range(0.01, 1),
            "give the fraction of peak throughput dense kernels reach; a typical model FLOPs utilisation is 0.4 "
            "to 0.6.",
            default=0.5,
        ),
    ),
)


# -- model ------------------------------------------------------------------------------------------

LANGUAGE_MODEL = Document(
    "LanguageModel",
    "Decoder-only transformer dimensions.",
    (
        _count("layers", "transformer layers", "give the number of transformer layers, e.g. 32."),
        _count("hidden", "hidden size", "give the hidden size, e.g. 4096."),
        _count("heads", "attention heads (they divide hidden)", "give the number of attention heads, e.g. 32."),
        _count(
            "kv_heads",
            "key/value heads (they divide heads)",
            "give the number of key/value heads (equal to heads without GQA).",
            derived="heads",
        ),
        _count("ffn_hidden", "MLP inner size", "give the MLP inner size, e.g. 14336."),
        _count("vocab", "vocabulary size", "give the vocabulary size, e.g. 128256."),
        _number("parameters", "parameter count (vision encoder excluded)", PARAMETERS, PARAMETERS_HINT),
        FieldSpec("gated_mlp", "bool", "SwiGLU-style MLP of three matrices (false: two)", default=True),
    ),
)
VISION_ENCODER = Document(
    "VisionEncoder",
    "A ViT that turns images into visual tokens: one token per (patch_size x merge_size)^2 pixels, or a fixed "
    "tokens_per_image.",
    (
        _count("layers", "encoder layers", "give the encoder's layer count, e.g. 32."),
        _count("hidden", "encoder hidden size", "give the encoder's hidden size, e.g. 1280."),
        _count("ffn_hidden", "encoder MLP size", "give the encoder's MLP size, e.g. 5120."),
        _number("parameters", "encoder parameter count", PARAMETERS, PARAMETERS_HINT),
        _count(
            "patch_size", "ViT patch size", "give the ViT patch size in pixels, e.g. 14.", unit="pixels", default=14
        ),
        _count(
            "merge_size",
            "token merge factor per side",
            "give the token merge factor per side (1 when tokens are not merged).",
            default=1,
        ),
        _count(
            "tokens_per_image",
            "a fixed visual token count per image",
            "give the fixed visual token count per image, or leave it out.",
            unit="tokens",
            default=None,
        ),
        _count(
            "min_tokens",
            "fewest visual tokens per image",
            "give the smallest visual token count per image.",
            unit="tokens",
            default=4,
        ),
        _count(
            "max_tokens",
            "most visual tokens per image",
            "give the largest visual token count per image.",
            unit="tokens",
            default=16384,
        ),
    ),
)
TRAINING = Document(
    "Training",
    "How the job trains, as far as memory and compute are concerned.",
    (
        _count(
            "zero_stage",
            "ZeRO/FSDP stage: 0 no sharding, 1 optimizer states, 2 gradients too, 3 parameters too",
            "choose the ZeRO/FSDP sharding stage the job uses.",
            0,
            high=3,
            default=1,
        ),
        FieldSpec(
            "recompute",
            "str",
            "activation recomputation: none, selective (attention recomputed) or full",
            "say how activations are recomputed.",
            default="selective",
            choices=("none", "selective", "full"),
        ),
    ),
)
MODEL = Document(
    "Model",
    "The trained model: a language model and, for a multimodal model, its vision encoder.",
    (
        FieldSpec("name", "str", "the model's name in plan listings", default="custom"),
        _document("llm", "the language model", LANGUAGE_MODEL),
        _document("vision", "the vision encoder of a multimodal model", VISION_ENCODER, default=None),
        _document("training", "sharding and recomputation", TRAINING, derived="ZeRO stage 1, selective recompute"),
    ),
)


# -- profile ----------------------------------------------------------------------------------------

TIME = Document(
    "ProfileTime",
    "Time coefficients: a group of size d takes group_constant plus, per sample of length L, "
    "(quadratic L^2 + linear L) / d + sample_constant.",
    (
        _number("quadratic", "seconds per token squared (attention)", PER_TOKEN2, PER_TOKEN2_HINT),
        _number("linear", "seconds per token", PER_TOKEN, PER_TOKEN_HINT),
        _number("sample_constant", "seconds per sample", SECONDS, SECONDS_HINT),
        _number("group_constant", "seconds per group and micro-batch", SECONDS, SECONDS_HINT),
        _number("vision_linear", "vision encoder seconds per visual token", PER_TOKEN, PER_TOKEN_HINT, default=0.0),
        _number(
            "vision_quadratic",
            "vision encoder seconds per visual token squared",
            PER_TOKEN2,
            PER_TOKEN2_HINT,
            default=0.0,
        ),
        _number(
            "sample_step", "seconds per sample and ring step of a group of d >= 2", SECONDS, SECONDS_HINT, default=0.0
        ),
        _number("step_constant", "seconds once per step whatever the plan", SECONDS, SECONDS_HINT, default=0.0),
    ),
)
BANDWIDTH_TABLE = FieldSpec(
    "bandwidth",
    "table",
    "by group size: read at the smallest listed size >= d",
    item=_number("bandwidth", "bandwidth", BANDWIDTH, BANDWIDTH_HINT),
)
BANDWIDTHS = Document(
    "ProfileBandwidths",
    "Bytes per second for groups inside a node (intra) and across nodes (inter), each a number or a table by "
    "group size.",
    (
        _number("intra", "inside a node", BANDWIDTH, BANDWIDTH_HINT, either=BANDWIDTH_TABLE),
        _number("inter", "across nodes", BANDWIDTH, BANDWIDTH_HINT, either=BANDWIDTH_TABLE),
    ),
)
LATENCIES = Document(
    "ProfileLatencies",
    "Seconds per message inside a node (intra) and across nodes (inter).",
    (
        _number("intra", "inside a node", LATENCY, LATENCY_HINT, default=0.0),
        _number("inter", "across nodes", LATENCY, LATENCY_HINT, default=0.0),
    ),
)
GROUP_MESSAGES = Document(
    "ProfileGroupMessages",
    "Messages a group of d >= 2 ranks exchanges per micro-batch: per_step (d - 1) + fixed.",
    (
        _number("per_step", "messages per ring step", MESSAGES, MESSAGES_HINT, default=0.0),
        _number("fixed", "messages whatever d", MESSAGES, MESSAGES_HINT, default=0.0),
    ),
)
COMM = Document(
    "ProfileComm",
    "Communication of context parallelism.",
    (
        FieldSpec(
            "scheme",
            "str",
            "ring, ulysses, or hybrid (Ulysses inside ring)",
            "use 'ring', 'ulysses' or 'hybrid'.",
            choices=CP_SCHEMES,
        ),
        _number(
            "bytes_per_token",
            "bytes a token sends: the ring's (key/value) volume, or the all-to-all's under ulysses",
            Range(0, 1e9, "bytes per token"),
            "give the bytes a token sends, e.g. 172032.",
        ),
        _number(
            "ulysses_bytes_per_token",
            "bytes a token sends in the all-to-alls of a hybrid group (query, key, value, output)",
            Range(0, 1e9, "bytes per token"),
            "give the all-to-all bytes a token sends, e.g. 458752; a hybrid profile needs it.",
            default=0.0,
        ),
        _document("bandwidth_bytes_per_s", "bandwidths", BANDWIDTHS),
        _document("latency_s", "latencies", LATENCIES, default=None, derived="0 s"),
        _number("messages_per_step", "messages per ring step of a sample", MESSAGES, MESSAGES_HINT, default=0.0),
        _number("messages_fixed", "messages a sample exchanges whatever d", MESSAGES, MESSAGES_HINT, default=0.0),
        FieldSpec(
            "overlap_with_attention", "bool", "the ring transfer hides behind the attention it feeds", default=False
        ),
        _document("group_messages", "messages per group and micro-batch", GROUP_MESSAGES, default=None, derived="none"),
        FieldSpec(
            "padded_bytes", "bool", "bytes sent are those of the sample padded as the trainer pads it", default=False
        ),
    ),
)
CAPACITY = Range(1, MAX_SAMPLE_TOKENS, "tokens")
CAPACITY_HINT = "give the tokens one rank holds in a micro-batch, e.g. 16384."
PROFILE = Document(
    "Profile",
    "A measured cost profile (SI units); it replaces the analytical cost model.",
    (
        _document("time", "time coefficients", TIME),
        _document("comm", "communication", COMM),
        _number(
            "capacity_tokens_per_rank",
            "tokens one rank holds in a micro-batch; or a table by GPU type name with a 'default' entry",
            CAPACITY,
            CAPACITY_HINT,
            either=FieldSpec(
                "capacity_tokens_per_rank",
                "table",
                "by GPU type name, with a 'default' entry",
                item=_number("capacity", "tokens", CAPACITY, CAPACITY_HINT),
            ),
        ),
        FieldSpec(
            "speed_by_gpu",
            "table",
            "relative speed of other GPU types in a mixed cluster (the profile's own GPU is 1.0)",
            default=None,
            derived="none",
            item=_number(
                "speed",
                "relative speed",
                Range(1e-3, 1e3),
                "give the GPU type's speed relative to the profile's own GPU (1.0), e.g. 0.32.",
            ),
        ),
        FieldSpec("source", "str", "where the numbers come from", default="given"),
    ),
)


# -- a whole request --------------------------------------------------------------------------------

REQUEST = Document(
    "Request",
    "A planning request: the documents above, presets by name for the cluster and the model, the job's existing "
    "communicators, and (from a POST /v1/plans body) how to answer.",
    (
        _document("batch", "the batch", BATCH),
        _document("cluster", "the cluster; or cluster_preset", CLUSTER, default=None, derived="cluster_preset"),
        FieldSpec("cluster_preset", "str", "a preset cluster name (dhp presets, GET /v1/presets)", default="h100-8x8"),
        _document("model", "the model; or model_preset", MODEL, default=None, derived="model_preset"),
        FieldSpec("model_preset", "str", "a preset model name (dhp presets, GET /v1/presets)", default="llama3-8b"),
        _document("profile", "a measured cost profile; replaces the analytical cost model", PROFILE, default=None),
        FieldSpec(
            "existing_groups",
            "list",
            "rank groups (communicators) the training job already has: a set, so their order and the order of each "
            "group's ranks do not matter",
            default=None,
            item=FieldSpec(
                "group", "list", "the ranks of one group", min_length=1, item=_count("rank", "a rank", "", 0)
            ),
        ),
        _document("options", "the planner options", OPTIONS, default=None),
        FieldSpec(
            "wait",
            "bool",
            "false: plan ahead; answer 202 with the id at once and solve in the background",
            default=True,
        ),
        FieldSpec("cache", "bool", "false: solve again even if an identical request was planned before", default=True),
    ),
)
DOCUMENTS: dict[str, Document] = {"batch": BATCH, "cluster": CLUSTER, "model": MODEL, "profile": PROFILE}
"""The input documents of a request, by member name (the options are :data:`~optimizer.problem.options.OPTIONS`)."""
