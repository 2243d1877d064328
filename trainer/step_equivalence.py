"""Multi-process checks of a plan: one training step on every rank, and the reference to compare with.

:func:`step_worker` is what each process of :func:`trainer.launch.spawn` runs: build the tiny model
from a fixed seed, apply the plan for its rank, create the plan's groups through a pool, run one
step and return the loss, the flat reduced gradient and timings. The equivalence test and the
example both use it.
"""

from __future__ import annotations

from typing import Any

import torch

from trainer.apply import apply_plan
from trainer.group_pool import GroupPool
from trainer.step import reference_step, train_step
from trainer.tiny_model import TinyConfig, TinyTransformer


def build_model(cfg: TinyConfig, seed: int, dtype: torch.dtype) -> TinyTransformer:
    torch.manual_seed(seed)
    return TinyTransformer(cfg).to(dtype)


def flat_grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in model.parameters()])


def step_worker(
    rank: int,
    world_size: int,
    plan_doc: dict[str, Any],
    cfg: TinyConfig,
    samples: dict[str, list[int]],
    seed: int = 0,
    dtype: str = "float64",
    steps: int = 1,
    warmup: int = 0,
    execution: str = "packed",
) -> dict[str, Any]:
    """One process of a planned step (see the module docstring), run ``packed`` or ``per-sample``
    (:mod:`trainer.step`); returns loss, gradient and seconds."""
    model = build_model(cfg, seed, getattr(torch, dtype))
    tensors = {k: torch.tensor(v, dtype=torch.int64) for k, v in samples.items()}
    work = apply_plan(plan_doc, rank)
    pool = GroupPool()
    pool.ensure(work.communicators)
    times, mb_times, loss, grad, barrier = [], [], 0.0, None, 0.0
    for i in range(warmup + steps):
        model.zero_grad(set_to_none=True)
        torch.distributed.barrier()
        result = train_step(model, work, pool, tensors, execution=execution)
        if i >= warmup:
            times.append(result.seconds)
            mb_times.append(result.micro_batch_seconds)
        loss, barrier = result.loss, result.barrier_seconds
        grad = flat_grad(model)
    return {
        "loss": loss,
        "grad": grad,
        "seconds": times,
        "micro_batch_seconds": mb_times,
        "barrier_seconds": barrier,
        "groups_created": pool.stats.created,
        "create_seconds": pool.stats.create_seconds,
    }


def reference(
    cfg: TinyConfig, samples: dict[str, list[int]], seed: int = 0, dtype: str = "float64"
) -> tuple[float, torch.Tensor]:
    """Loss and flat gradient of the whole batch on one process."""
    model = build_model(cfg, seed, getattr(torch, dtype))
    loss = reference_step(model, {k: torch.tensor(v, dtype=torch.int64) for k, v in samples.items()})
    return loss, flat_grad(model)
