"""Seeded generators of realistic batches, as batch documents (``{"samples": [...]}``).

Parameter sources (see also ../docs in the repository):
- LLaVA-1.5 (CLIP ViT-L/14 at 336 px): 576 visual tokens per image.
- LLaVA-NeXT / OneVision (SigLIP 384/14): 729 tokens per crop, anyres grids up to 6x6 crops;
  video about 196 tokens per frame after pooling.
- Qwen2-VL: one token per 28x28 pixels, 4 to 16,384 tokens per image.
- Long-tail lengths: most clips are short and a few are very long (log-normal frame counts).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

TOKENS_PER_FRAME = 196
TOKENS_PER_LLAVA_IMAGE = 576
TOKENS_PER_CROP = 729


def _text(rng: np.random.Generator, median: float, sigma: float, cap: int) -> int:
    return int(min(cap, max(8, rng.lognormal(np.log(median), sigma))))


def long_tail_video(n: int, seed: int = 0, max_frames: int = 1200) -> dict[str, Any]:
    """Video SFT: log-normal frame counts (median 24 frames, sigma 1.2), capped at ``max_frames``
    (ten minutes at 2 fps), 196 tokens per frame."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        frames = int(min(max_frames, max(4, rng.lognormal(np.log(24), 1.2))))
        samples.append(
            {
                "id": f"v{k}",
                "text_tokens": _text(rng, 120, 0.8, 4096),
                "videos": [{"frames": frames, "tokens_per_frame": TOKENS_PER_FRAME}],
            }
        )
    return {"samples": samples}


def image_sft(n: int, seed: int = 0) -> dict[str, Any]:
    """Image SFT in the LLaVA-1.5 style: mostly one image of 576 tokens, some multi-image, conversational text."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        images = int(rng.choice([0, 1, 1, 1, 1, 1, 2, 3, 4, 8]))
        doc: dict[str, Any] = {"id": f"i{k}", "text_tokens": _text(rng, 300, 0.9, 8192)}
        if images:
            doc["images"] = [{"tokens": TOKENS_PER_LLAVA_IMAGE, "frames": images}]
        samples.append(doc)
    return {"samples": samples}


def anyres_images(n: int, seed: int = 0) -> dict[str, Any]:
    """LLaVA-NeXT anyres: a base view plus a grid of up to 6x6 crops, 729 tokens each."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        rows, cols = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        samples.append(
            {
                "id": f"a{k}",
                "text_tokens": _text(rng, 250, 0.9, 8192),
                "images": [{"tokens": TOKENS_PER_CROP, "frames": 1 + rows * cols}],
            }
        )
    return {"samples": samples}


def dynamic_resolution(n: int, seed: int = 0) -> dict[str, Any]:
    """Qwen2-VL dynamic resolution: 4 to 16,384 tokens per image (log-uniform), 1-4 images."""
    rng = np.random.default_rng(seed)
    samples = []
    for k in range(n):
        count = int(rng.integers(1, 5))
        imgs = [{"tokens": int(np.exp(rng.uniform(np.log(4), np.log(16384))))} for _ in range(count)]
        samples.append({"id": f"d{k}", "text_tokens": _text(rng, 300, 0.9, 8192), "images": imgs})
    return {"samples": samples}


def long_text(n: int, seed: int = 0, max_tokens: int = 131072) -> dict[str, Any]:
    """Long-context text: log-normal lengths (median 2K), most under 4K, a tail to ``max_tokens``."""
    rng = np.random.default_rng(seed)
    return {"samples": [{"id": f"t{k}", "text_tokens": _text(rng, 2048, 1.3, max_tokens)} for k in range(n)]}


def mixed(n: int, seed: int = 0) -> dict[str, Any]:
    """A multimodal mix: 40% image SFT, 20% dynamic resolution, 25% video, 15% long text."""
    rng = np.random.default_rng(seed)
    parts = rng.multinomial(n, [0.4, 0.2, 0.25, 0.15])
    samples: list[dict[str, Any]] = []
    for gen, count, s in zip((image_sft, dynamic_resolution, long_tail_video, long_text), parts, range(4), strict=True):
        samples.extend(gen(int(count), seed * 10 + s)["samples"])
    order = rng.permutation(len(samples))
    return {"samples": [dict(samples[i], id=f"m{k}") for k, i in enumerate(order)]}


WORKLOADS: dict[str, Callable[..., dict[str, Any]]] = {
    "video": long_tail_video,
    "image-sft": image_sft,
    "anyres": anyres_images,
    "dynamic-res": dynamic_resolution,
    "long-text": long_text,
    "mixed": mixed,
}
