"""Workers for the multi-process tests of :mod:`trainer.megatron` (module-level so spawned processes import them).

:func:`megatron_step_worker` runs Megatron-Core's own hybrid-CP code on CPU: its data-loader wrapper
(``HybridCPDataLoaderWrapper.__next__``: all-gathers the sub-sample lengths, asks the scheduler,
reroutes the samples with an all-to-all) with :class:`trainer.megatron.PlannedCPScheduler`
installed, then its forward-backward loop (``hybrid_context_parallel_forward_backward``: one forward
and backward per sub-sample, a barrier between barrier groups, the last sub-sample outside
``no_sync``). Only what needs CUDA is stood in: ``.cuda()`` and CUDA devices become the CPU, the
parallel-state getters answer for a job of data x context parallelism alone (tensor-parallel size
1), and the forward and backward steps record what they are given instead of running a model.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch
import torch.distributed as dist


class _CPUTorch(types.ModuleType):
    """``torch`` as Megatron's schedule module sees it: tensors asked for on 'cuda' are made on the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = types.SimpleNamespace(current_device=lambda: "cpu")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    @staticmethod
    def tensor(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.tensor(*args, **kwargs)

    @staticmethod
    def empty(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return torch.empty(*args, **kwargs)


def _batch(rank: int, lengths: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    """This rank's packed samples (one per inner list of ``lengths``), tokens numbered by global sub-sample."""
    out = []
    for k, packed in enumerate(lengths):
        cu = torch.tensor([0, *torch.tensor(packed).cumsum(0).tolist()], dtype=torch.int32)
        tokens = torch.cat(
            [torch.full((n,), rank * 1000 + k * 100 + j, dtype=torch.int64) for j, n in enumerate(packed)]
        )
        out.append({"tokens": tokens, "cu_seqlens": cu})
    return out


def megatron_step_worker(
    rank: int,
    world_size: int,
    lengths: dict[int, list[list[int]]],
    capacity: int,
    profile: dict[str, Any],
    modes: tuple[bool, ...],
) -> list[dict[str, Any]]:
    """The global batch through Megatron's wrapper and forward-backward loop once per mode (``deterministic``
    False: rank 0 plans and broadcasts; True: every rank plans); what each rank ran each time."""
    return [_megatron_step(rank, world_size, lengths, capacity, profile, deterministic) for deterministic in modes]


def _megatron_step(
    rank: int,
    world_size: int,
    lengths: dict[int, list[list[int]]],
    capacity: int,
    profile: dict[str, Any],
    deterministic: bool,
) -> dict[str, Any]:
    from megatron.core import parallel_state
    from megatron.core.datasets.data_schedule import HybridCPDataLoaderWrapper
    from megatron.core.pipeline_parallel import hybrid_cp_schedule, schedules

    from trainer.megatron import install

    tp_groups = [dist.new_group([r]) for r in range(world_size)]  # every rank creates every group, in order
    world = dist.group.WORLD
    pg = types.SimpleNamespace(dp_cp=world, dp=world, tp=tp_groups[rank])
    config = types.SimpleNamespace(max_seqlen_per_dp_cp_rank=capacity)
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    wrapper = HybridCPDataLoaderWrapper(iter([_batch(rank, lengths[rank])]), config, pg)
    scheduler = install(wrapper, profile=profile, gpus_per_node=2, budget_ms=2000, deterministic=deterministic)
    samples, sample_id_groups = next(wrapper)

    for name, value in {
        "get_data_parallel_rank": lambda **kw: rank,
        "get_tensor_model_parallel_rank": lambda: 0,
        "get_tensor_model_parallel_src_rank": lambda: rank,
        "get_tensor_model_parallel_group": lambda **kw: tp_groups[rank],
        "get_data_parallel_group": lambda **kw: world,
    }.items():
        setattr(parallel_state, name, value)
    hybrid_cp_schedule.torch = _CPUTorch()  # type: ignore[attr-defined]
    ran: list[dict[str, Any]] = []
    barriers = [0]
    real_barrier = dist.barrier

    def barrier(*args: Any, **kwargs: Any) -> Any:
        barriers[0] += 1
        return real_barrier(*args, **kwargs)

    def forward_step(func: Any, data_iterator: Any, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        sample = next(data_iterator)
        ran.append(
            {
                "tokens": sample["tokens"].tolist()[:1],
                "length": int(sample["tokens"].numel()),
                "cp": int(sample["local_cp_size"]),
            }
        )
        return torch.zeros(()), torch.tensor(int(sample["tokens"].numel()))

    schedules.forward_step = forward_step  # type: ignore[assignment]
    schedules.backward_step = lambda *a, **k: None  # type: ignore[assignment]
    dist.barrier = barrier  # type: ignore[assignment]
    try:
        hybrid_cp_schedule.hybrid_context_parallel_forward_backward(
            None,
            iter([(samples, sample_id_groups)]),
            None,
            1,
            None,
            None,
            [],
            None,
            False,
            False,
            False,
            contextlib.nullcontext,
            0,
            lambda first, only, mb: mb,
            None,
        )
    finally:
        dist.barrier = real_barrier  # type: ignore[assignment]
    return {
        "ran": ran,
        "barriers": barriers[0],
        "groups": len(sample_id_groups),
        "digest": scheduler.last["digest"],
        "sample_id_groups": sample_id_groups,
        "received": sorted(samples),
        "source": scheduler.last.get("source"),
    }
