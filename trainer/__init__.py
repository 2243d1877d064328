"""Trainer side of dhp-planner: run a plan with PyTorch.

Modules: :mod:`trainer.group_pool` (process groups created once, reused), :mod:`trainer.apply`
(what a rank does in each micro-batch of a plan), :mod:`trainer.ranks` (planner and global ranks
under TP/PP), :mod:`trainer.ring_attention` and :mod:`trainer.attention_tiles` (ring and Ulysses
context-parallel attention for any group size, float32 accumulators, GQA), :mod:`trainer.tiny_model`
(a small transformer for checks and examples), :mod:`trainer.hf_adapter` (a Hugging Face causal LM
with the planned attention), :mod:`trainer.routing` (samples to the ranks that need them),
:mod:`trainer.plan_sync` (plan broadcast and digest), :mod:`trainer.step` (one training step of a
plan, packed or per sample), :mod:`trainer.train_hf` (the torchrun entry point),
:mod:`trainer.arms` (the plan sources it compares: static, Megatron-Core's scheduler, dhp under
Megatron's rules, dhp), :mod:`trainer.per_sample_costs` (the cost profile of per-sample execution),
:mod:`trainer.profiler` (measures a cost profile); checks: :mod:`trainer.attention_check`,
:mod:`trainer.cost_check`, :mod:`trainer.gpu_check`. Importing this package does not import torch;
the modules that need it import it themselves (``pip install 'dhp-planner[trainer]'``).
"""
