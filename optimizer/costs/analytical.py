"""The analytical cost profile: coefficients derived from the model's shape and the hardware.

It produces a :class:`~optimizer.costs.profile.CostProfile`, the same form a trainer sends after
profiling, so a user can read exactly what the planner assumed (``dhp plan --show-profile``).

Sources of the constants:
- FLOPs: a dense block does 2 FLOPs per weight per token (projections and MLP); causal attention
  adds about 2 L^2 h FLOPs per layer forward (QK^T and AV, half the square); backward is about twice
  the forward, so training is 3x forward (4x with full recomputation).
- Activation memory: about 34 h bytes per token per layer in bf16 with flash attention and selective
  recomputation (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
  2022); about 2 h bytes per layer under full recomputation plus one layer's worth.
- Model states: 18 bytes per parameter (bf16 weights, fp32 gradients, fp32 master weights and two
  Adam moments), the optimizer part sharded over the domain from ZeRO stage 1 on.
- Ring context parallelism sends every rank's key/value chunk around the ring once forward and
  key/value plus their gradients backward; Ulysses moves query, key, value and output with
  all-to-alls forward and backward.
"""

from __future__ import annotations

from dataclasses import replace

from optimizer.costs.profile import Bandwidth, CostProfile
from optimizer.errors import InfeasibleError
from optimizer.problem.cluster import Cluster
from optimizer.problem.model import ModelSpec

BF16 = 2
SAMPLE_OVERHEAD_PER_LAYER_S = 10e-6
"""Per-sample kernel launch and bookkeeping per layer pass (three passes: forward, two backward)."""
GROUP_OVERHEAD_PER_LAYER_S = 40e-6
"""Per-micro-batch fixed cost per layer pass of a group (launches, synchronisation)."""


def model_state_bytes_per_rank(model: ModelSpec, cluster: Cluster) -> float:
    """Parameters, gradients and optimizer states one rank holds."""
    params = model.llm.parameters + (model.vision.parameters if model.vision else 0.0)
    params /= cluster.tensor_parallel * cluster.pipeline_parallel
    n = cluster.domain_size
    stage = model.training.zero_stage
    weights, grads, optim = 2.0, 4.0, 12.0
    if stage >= 1:
        optim /= n
    if stage >= 2:
        grads /= n
    if stage >= 3:
        weights /= n
    return params * (weights + grads + optim)


def activation_bytes_per_token(model: ModelSpec, cluster: Cluster) -> float:
    """Activation memory per token a rank holds, for the whole in-flight pipeline."""
    llm = model.llm
    tp = cluster.tensor_parallel
    per_layer = {"none": 40.0, "selective": 34.0, "full": 2.0}[model.training.recompute] * llm.hidden / tp
    total = llm.layers * per_layer
    if model.training.recompute == "full":
        total += 34.0 * llm.hidden / tp
    total += 4.0 * llm.vocab / tp  # fp32 logits of the last stage
    return total


def exchange_bytes_per_token(model: ModelSpec, cluster: Cluster) -> tuple[float, float]:
    """Bytes a token sends per rank in a training step: (ring's key/value exchange, Ulysses' all-to-alls)."""
    llm = model.llm
    tp = cluster.tensor_parallel
    layers = llm.layers / cluster.pipeline_parallel
    kv_bytes = 2.0 * llm.kv_dim * BF16 / tp
    return 3.0 * layers * kv_bytes, 2.0 * layers * (2.0 * llm.hidden + 2.0 * llm.kv_dim) * BF16 / tp


def as_hybrid(profile: CostProfile, model: ModelSpec, cluster: Cluster) -> CostProfile:
    """``profile`` (ring or Ulysses) as a hybrid profile: its measured volume kept, the other scheme's
    volume scaled from it by the model's ratio of the two (:func:`exchange_bytes_per_token`)."""
    if profile.scheme == "hybrid":
        return profile
    ring_bytes, a2a_bytes = exchange_bytes_per_token(model, cluster)
    if profile.scheme == "ring":
        ring, a2a = profile.bytes_per_token, profile.bytes_per_token * a2a_bytes / ring_bytes
        other = "all-to-all"
    else:
        ring, a2a = profile.bytes_per_token * ring_bytes / a2a_bytes, profile.bytes_per_token
        other = "ring"
    return replace(
        profile,
        scheme="hybrid",
        bytes_per_token=ring,
        ulysses_bytes_per_token=a2a,
        source=f"{profile.source}; as hybrid, the {other} volume scaled by {model.name}'s shape",
    )


def analytical_profile(model: ModelSpec, cluster: Cluster, scheme: str = "ring") -> CostProfile:
    """Derive the cost profile for ``model`` trained on ``cluster`` with the given CP scheme."""
    llm = model.llm
    tp, pp = cluster.tensor_parallel, cluster.pipeline_parallel
    ref = cluster.nodes[0].gpu
    rate = ref.peak_flops * cluster.efficiency * tp  # FLOP/s of one rank (tp GPUs)
    passes = 4.0 if model.training.recompute == "full" else 3.0
    layers = llm.layers / pp

    mlp_mats = 3 if llm.gated_mlp else 2
    linear_flops = 2.0 * (
        2 * llm.hidden * llm.hidden + 2 * llm.hidden * llm.kv_dim + mlp_mats * llm.hidden * llm.ffn_hidden
    )
    linear_per_token = passes * (layers * linear_flops + 2.0 * llm.hidden * llm.vocab / pp)
    quadratic_per_token2 = passes * layers * 2.0 * llm.hidden

    vision_linear = vision_quadratic = 0.0
    if model.vision is not None:
        v = model.vision
        m2 = v.patches_per_token
        per_patch = 2.0 * (4 * v.hidden * v.hidden + 2 * v.hidden * v.ffn_hidden)
        vision_linear = 3.0 * v.layers * per_patch * m2 / rate
        vision_quadratic = 3.0 * v.layers * 4.0 * v.hidden * m2 * m2 / rate

    ring_bytes, a2a_bytes = exchange_bytes_per_token(model, cluster)
    ulysses_bytes = 0.0
    if scheme == "ring":
        bytes_per_token = ring_bytes
        messages = 3.0 * layers
    elif scheme == "ulysses":
        bytes_per_token = a2a_bytes
        messages = 8.0 * layers
    else:
        bytes_per_token, ulysses_bytes = ring_bytes, a2a_bytes
        messages = 3.0 * layers

    def capacity(memory: float) -> float:
        free = memory - cluster.memory_reserve_bytes - model_state_bytes_per_rank(model, cluster) / 1.0
        return max(0.0, free) / activation_bytes_per_token(model, cluster)

    capacity_by_gpu = {}
    speed_by_gpu = {}
    if not cluster.homogeneous:
        for node in cluster.nodes:
            capacity_by_gpu[node.gpu.name] = float(int(capacity(node.gpu.memory_bytes)))
            speed_by_gpu[node.gpu.name] = node.gpu.peak_flops / ref.peak_flops
    ref_capacity = float(int(capacity(ref.memory_bytes)))
    if ref_capacity < 1:
        states = model_state_bytes_per_rank(model, cluster)
        raise InfeasibleError(
            f"the model states alone need {states / 1e9:.1f} GB per rank (ZeRO-{model.training.zero_stage} over "
            f"{cluster.domain_size} ranks) and {ref.name} has {ref.memory_bytes / 1e9:.0f} GB, "
            f"{cluster.memory_reserve_bytes / 1e9:.0f} GB of it reserved: no activation fits",
            field="model.training.zero_stage",
            hint=(
                "shard more (zero_stage 3), add ranks, use tensor or pipeline parallelism, or send a measured profile."
            ),
        )

    return CostProfile(
        quadratic=quadratic_per_token2 / rate,
        linear=linear_per_token / rate,
        sample_constant=passes * layers * SAMPLE_OVERHEAD_PER_LAYER_S,
        group_constant=passes * layers * GROUP_OVERHEAD_PER_LAYER_S,
        scheme=scheme,
        bytes_per_token=bytes_per_token,
        intra_bandwidth=Bandwidth.constant(cluster.intra_bandwidth * tp),
        inter_bandwidth=Bandwidth.constant(cluster.inter_bandwidth * tp),
        capacity_tokens_per_rank=ref_capacity,
        capacity_by_gpu=capacity_by_gpu,
        vision_linear=vision_linear,
        vision_quadratic=vision_quadratic,
        intra_latency=cluster.intra_latency,
        inter_latency=cluster.inter_latency,
        messages_per_step=messages,
        overlap_with_attention=scheme != "ulysses",
        ulysses_bytes_per_token=ulysses_bytes,
        speed_by_gpu=speed_by_gpu,
        source=(
            f"analytical: {model.name} on {cluster.name} ({ref.name}, efficiency {cluster.efficiency:g}, "
            f"ZeRO-{model.training.zero_stage}, recompute {model.training.recompute})"
        ),
    )
