"""A tiny decoder-only transformer whose attention is supplied by the caller.

The model works on one rank's tokens of a micro-batch (any mix of samples and shards) given each
token's id and its position in its sample; ``attend(q, k, v)`` is ring, Ulysses or plain causal
attention over the right layout (:mod:`trainer.ring_attention`). Everything else (embeddings,
norms, MLPs, output head) acts token by token, so sharding the tokens shards the model's work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class TinyConfig:
    """Dimensions of the tiny model."""

    vocab: int = 96
    """Vocabulary size."""
    hidden: int = 48
    """Width of the residual stream."""
    heads: int = 6
    """Attention heads (6: Ulysses works for groups of 1, 2, 3 and 6)."""
    layers: int = 2
    """Transformer blocks."""
    ffn_hidden: int = 64
    """Inner width of the MLP."""
    max_positions: int = 4096
    """Positions with a learned embedding; later positions share the last one."""

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"TinyConfig.hidden {self.hidden} must be a multiple of heads {self.heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def parameters(self) -> int:
        h, f = self.hidden, self.ffn_hidden
        per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        return self.vocab * h * 2 + self.max_positions * h + self.layers * per_layer + 2 * h + self.vocab

    def model_document(self) -> dict[str, Any]:
        """The model as a planner request's ``model`` document."""
        return {
            "name": "tiny",
            "llm": {
                "layers": self.layers,
                "hidden": self.hidden,
                "heads": self.heads,
                "kv_heads": self.heads,
                "ffn_hidden": self.ffn_hidden,
                "vocab": self.vocab,
                "parameters": float(self.parameters()),
                "gated_mlp": False,
            },
        }


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm2 = nn.LayerNorm(cfg.hidden)
        self.up = nn.Linear(cfg.hidden, cfg.ffn_hidden)
        self.down = nn.Linear(cfg.ffn_hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv(self.norm1(x)).reshape(t, 3, self.cfg.heads, self.cfg.head_dim).unbind(1)
        x = x + self.out(attend(q, k, v).reshape(t, self.cfg.hidden))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyTransformer(nn.Module):
    """Token ids and in-sample positions in, next-token logits out (see the module docstring)."""

    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = self.embed(tokens) + self.pos(positions.clamp(max=self.cfg.max_positions - 1))
        for block in self.blocks:
            x = block(x, attend)
        return self.head(self.norm(x))
