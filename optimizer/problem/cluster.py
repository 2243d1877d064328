"""The cluster: nodes of GPUs, their links, and the data x context-parallel domain that is planned.

Vocabulary: a *GPU* is a device; a *rank* is a position in the planned domain (what remains after
tensor and pipeline parallelism are laid out). With Megatron's usual ordering tensor parallelism is
innermost, data/context parallelism next and pipeline parallelism outermost, so domain rank ``r`` of
pipeline stage 0 owns GPUs ``r*tp .. r*tp+tp-1``; every stage repeats the same grouping.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from optimizer.errors import ProblemError
from optimizer.problem.checks import require_int, require_number


@dataclass(frozen=True)
class GPUType:
    """One kind of accelerator."""

    name: str
    """Marketing name, e.g. ``H100-SXM``."""
    memory_bytes: float
    """Device memory in bytes."""
    peak_flops: float
    """Peak dense bf16 throughput in FLOP/s."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ProblemError("must be a non-empty string", field="gpu.name", hint="name the GPU type, e.g. 'H100'.")
        require_number(self.memory_bytes, "gpu.memory_bytes", "give the device memory in bytes, e.g. 80e9.")
        require_number(self.peak_flops, "gpu.peak_flops", "give the peak dense bf16 FLOP/s, e.g. 989e12.")


@dataclass(frozen=True)
class Node:
    """A host with ``gpus`` identical GPUs joined by the intra-node links."""

    gpu: GPUType
    gpus: int

    def __post_init__(self) -> None:
        require_int(self.gpus, "nodes[].gpus", "give the number of GPUs in the node, e.g. 8.")


@dataclass(frozen=True)
class Cluster:
    """Nodes, links and the fixed tensor/pipeline layout. Validated on construction."""

    nodes: tuple[Node, ...]
    intra_bandwidth: float
    """Per-GPU bandwidth inside a node (NVLink class), bytes/s."""
    inter_bandwidth: float
    """Per-GPU bandwidth between nodes (network), bytes/s."""
    intra_latency: float = 5e-6
    """Latency of one message inside a node, seconds."""
    inter_latency: float = 2e-5
    """Latency of one message between nodes, seconds."""
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    name: str = "custom"
    memory_reserve_bytes: float = 4e9
    """Memory per GPU kept back for the framework, the communicators and fragmentation."""
    efficiency: float = 0.5
    """Fraction of peak throughput that dense kernels reach (model FLOPs utilisation)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise ProblemError(
                "must list at least one node",
                field="cluster.nodes",
                hint='describe the nodes, or use the shorthand {"nodes": K, "gpus_per_node": G}.',
            )
        require_number(
            self.intra_bandwidth, "cluster.intra_bandwidth", "give bytes/s per GPU inside a node, e.g. 4.5e11."
        )
        require_number(
            self.inter_bandwidth, "cluster.inter_bandwidth", "give bytes/s per GPU between nodes, e.g. 5e10."
        )
        require_number(
            self.intra_latency, "cluster.intra_latency", "give a latency in seconds, e.g. 5e-6.", positive=False
        )
        require_number(
            self.inter_latency, "cluster.inter_latency", "give a latency in seconds, e.g. 2e-5.", positive=False
        )
        require_int(self.tensor_parallel, "cluster.tensor_parallel", "use 1 when tensor parallelism is off.")
        require_int(self.pipeline_parallel, "cluster.pipeline_parallel", "use 1 when pipeline parallelism is off.")
        require_number(
            self.memory_reserve_bytes, "cluster.memory_reserve_bytes", "give bytes, e.g. 4e9.", positive=False
        )
        if not isinstance(self.efficiency, (int, float)) or not 0 < self.efficiency <= 1:
            raise ProblemError(
                f"must be in (0, 1], got {self.efficiency!r}",
                field="cluster.efficiency",
                hint="a typical model FLOPs utilisation is 0.4 to 0.6.",
            )
        tp, pp = self.tensor_parallel, self.pipeline_parallel
        for i, node in enumerate(self.nodes):
            if node.gpus % tp:
                raise ProblemError(
                    f"node {i} has {node.gpus} GPUs, which tensor parallel size {tp} does not divide",
                    field=f"cluster.nodes[{i}].gpus",
                    hint=(
                        "keep tensor-parallel groups inside a node: choose a tensor_parallel that divides every "
                        "node's GPU count."
                    ),
                )
        if self.total_gpus % (tp * pp):
            raise ProblemError(
                (
                    f"{self.total_gpus} GPUs cannot be split into tensor_parallel {tp} x pipeline_parallel {pp} x a "
                    "data/context domain"
                ),
                field="cluster.pipeline_parallel",
                hint=f"choose tensor_parallel x pipeline_parallel dividing {self.total_gpus}.",
            )

    @cached_property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def domain_size(self) -> int:
        """Number of ranks N in the planned data x context-parallel domain."""
        return self.total_gpus // (self.tensor_parallel * self.pipeline_parallel)

    @cached_property
    def rank_node(self) -> tuple[int, ...]:
        """Node index of every domain rank (pipeline stage 0)."""
        gpu_node: list[int] = []
        for i, node in enumerate(self.nodes):
            gpu_node.extend([i] * node.gpus)
        tp = self.tensor_parallel
        return tuple(gpu_node[r * tp] for r in range(self.domain_size))

    @cached_property
    def node_rank_ranges(self) -> tuple[tuple[int, int], ...]:
        """For every node holding domain ranks: the half-open range [first, last+1) of its ranks."""
        ranges: list[tuple[int, int]] = []
        start = 0
        nodes = self.rank_node
        for r in range(1, len(nodes) + 1):
            if r == len(nodes) or nodes[r] != nodes[start]:
                ranges.append((start, r))
                start = r
        return tuple(ranges)

    def rank_gpu(self, rank: int) -> GPUType:
        return self.nodes[self.rank_node[rank]].gpu

    def same_node(self, ranks: tuple[int, ...] | list[int]) -> bool:
        nodes = self.rank_node
        first = nodes[ranks[0]]
        return all(nodes[r] == first for r in ranks)

    @property
    def homogeneous(self) -> bool:
        return len({n.gpu for n in self.nodes}) == 1

    def describe(self) -> str:
        kinds: dict[str, int] = {}
        for n in self.nodes:
            kinds[n.gpu.name] = kinds.get(n.gpu.name, 0) + n.gpus
        gpus = ", ".join(f"{c}x {k}" for k, c in kinds.items())
        return (
            f"{len(self.nodes)} nodes ({gpus}), TP={self.tensor_parallel} PP={self.pipeline_parallel}, "
            f"domain of {self.domain_size} ranks"
        )
