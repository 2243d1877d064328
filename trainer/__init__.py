"""Trainer side of dhp-planner: run a plan with PyTorch.

Modules: :mod:`trainer.group_pool` (process groups created once, reused), :mod:`trainer.apply`
(what a rank does in each micro-batch of a plan), :mod:`trainer.ring_attention` (ring and Ulysses
context-parallel attention for any group size), :mod:`trainer.tiny_model` (a small transformer for
checks and examples), :mod:`trainer.step` (one training step of a plan), :mod:`trainer.profiler`
(measures a cost profile). Importing this package does not import torch; the modules that need it
import it themselves (``pip install 'dhp-planner[trainer]'``).
"""
