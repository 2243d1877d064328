"""A Hugging Face causal LM (Llama / Qwen2 family) trained with the planned context-parallel attention.

:class:`HFCausalLM` wraps a ``transformers`` causal LM so that :func:`trainer.step.train_step` can
run it like the tiny model: token ids and in-sample positions of one rank's shards in, next-token
logits out, attention supplied per micro-batch (ring or Ulysses over the rank's group). The
model's own attention function is replaced through the library's attention registry
(``AttentionInterface``) by one that hands the projected queries, keys and values (after the
rotary embedding, keys and values with their own, possibly fewer, heads) to the micro-batch's
attention; the mask the library would build is skipped (the attention knows every token's sample
and position). Everything else (embeddings, norms, MLPs, rotary embeddings from the positions
given, the output head) runs token by token as the library defines it.

:func:`tiny_llama` builds a small randomly initialised Llama model locally (nothing is downloaded),
for tests and examples. :func:`reference_loss` runs each sample alone through the unmodified model
(the library's own attention), the single-process reference of a planned step.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trainer.tiny_model import Attend

IMPLEMENTATION = "dhp_context_parallel"
"""The name under which the attention is registered with ``transformers``."""

_current: contextvars.ContextVar[Attend | None] = contextvars.ContextVar("dhp_attend", default=None)
_registered = False


def _attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The registered attention: [1, H, T, D] queries and [1, Hkv, T, D] keys/values to [1, T, H, D]."""
    attend = _current.get()
    if attend is None:
        raise RuntimeError(
            f"the {IMPLEMENTATION!r} attention runs only inside HFCausalLM.forward (no micro-batch attention is set)"
        )
    if query.shape[0] != 1:
        raise ValueError(
            f"context-parallel attention takes one packed sequence per rank (batch 1), got batch {query.shape[0]}"
        )
    if dropout:
        raise ValueError(
            "attention dropout is not supported by the context-parallel attention; set attention_dropout to 0"
        )
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    out = attend(q, k, v, scaling)  # type: ignore[call-arg]
    return out.unsqueeze(0), None


def _no_mask(*args: Any, **kwargs: Any) -> None:
    return None


def register() -> None:
    """Register the attention (and its skipped mask) with ``transformers``; idempotent."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, _attention)
    AttentionMaskInterface.register(IMPLEMENTATION, _no_mask)
    _registered = True


class HFCausalLM(nn.Module):
    """``(tokens, positions, attend) -> logits`` over a ``transformers`` causal LM (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        register()
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "num_attention_heads"):
            raise ValueError("HFCausalLM needs a transformers causal LM (a model with a config)")
        if getattr(config, "use_sliding_window", False):
            raise ValueError(
                "sliding-window attention is not supported by the context-parallel attention; "
                "set use_sliding_window to False"
            )
        self.model = model
        config._attn_implementation = IMPLEMENTATION
        self.vocab = int(config.vocab_size)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, attend: Attend) -> torch.Tensor:
        token = _current.set(attend)
        try:
            out = self.model(input_ids=tokens.unsqueeze(0), position_ids=positions.unsqueeze(0), use_cache=False)
        finally:
            _current.reset(token)
        return out.logits[0]


SMALL = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
}
"""The dimensions of the small models built below (GQA: 4 query heads, 2 key/value heads), before overrides."""


def _built(family: str, seed: int, dtype: torch.dtype, overrides: dict[str, Any]) -> nn.Module:
    import transformers

    config = getattr(transformers, f"{family}Config")(**{**SMALL, **overrides})
    torch.manual_seed(seed)
    model: nn.Module = getattr(transformers, f"{family}ForCausalLM")(config)
    return model.to(dtype=dtype)


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> nn.Module:
    """A small random-weight Llama model built locally (:data:`SMALL`, with ``overrides``)."""
    return _built("Llama", seed, dtype, overrides)


def tiny_qwen2(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides: Any) -> nn.Module:
    """A random-weight Qwen2 model built locally (biases on the query, key and value projections; no sliding
    window), :data:`SMALL` with ``overrides``."""
    return _built("Qwen2", seed, dtype, {"use_sliding_window": False, **overrides})


def model_document(model: nn.Module, name: str = "hf-tiny") -> dict[str, Any]:
    """The model as a planner request's ``model`` document (dimensions from its config)."""
    c: Any = model.config
    return {
        "name": name,
        "llm": {
            "layers": int(c.num_hidden_layers),
            "hidden": int(c.hidden_size),
            "heads": int(c.num_attention_heads),
            "kv_heads": int(c.num_key_value_heads),
            "ffn_hidden": int(c.intermediate_size),
            "vocab": int(c.vocab_size),
            "parameters": float(sum(p.numel() for p in model.parameters())),
            "gated_mlp": True,
        },
    }


def reference_loss(model: nn.Module, samples: Mapping[str, torch.Tensor], attn_implementation: str = "sdpa") -> float:
    """Mean next-token loss of the whole batch, each sample alone through the library's own
    attention; back-propagates it."""
    from trainer.step import label_count

    config: Any = model.config
    config._attn_implementation = attn_implementation
    total = label_count(samples)
    loss_sum = torch.zeros((), dtype=torch.float64)
    for ids in samples.values():
        if ids.numel() < 2:
            continue
        logits = model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1].double(), ids[1:], reduction="sum") / max(total, 1)
        loss.backward()
        loss_sum += loss.detach()
    return float(loss_sum)
