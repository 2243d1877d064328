"""The model being trained: a language model and an optional vision encoder."""

from __future__ import annotations

from dataclasses import dataclass

from optimizer.errors import ProblemError
from optimizer.problem.checks import require_int, require_number


@dataclass(frozen=True)
class LanguageModel:
    """Decoder-only transformer dimensions."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    parameters: float
    """Total parameter count (vision encoder excluded)."""
    gated_mlp: bool = True
    """True for SwiGLU-style MLPs with three matrices, False for two."""

    def __post_init__(self) -> None:
        for name, hint in (
            ("layers", "give the number of transformer layers, e.g. 32."),
            ("hidden", "give the hidden size, e.g. 4096."),
            ("heads", "give the number of attention heads, e.g. 32."),
            ("kv_heads", "give the number of key/value heads (equal to heads without GQA)."),
            ("ffn_hidden", "give the MLP inner size, e.g. 14336."),
            ("vocab", "give the vocabulary size, e.g. 128256."),
        ):
            require_int(getattr(self, name), f"model.llm.{name}", hint)
        if self.hidden % self.heads:
            raise ProblemError(
                f"hidden {self.hidden} is not a multiple of heads {self.heads}",
                field="model.llm.heads",
                hint="heads must divide hidden.",
            )
        if self.heads % self.kv_heads:
            raise ProblemError(
                f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}",
                field="model.llm.kv_heads",
                hint="kv_heads must divide heads.",
            )
        require_number(self.parameters, "model.llm.parameters", "give the parameter count, e.g. 8.03e9.")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


@dataclass(frozen=True)
class VisionEncoder:
    """A ViT that turns images into visual tokens for the language model.

    ``patch_size`` and ``merge_size`` give the dynamic-resolution rule (one visual token per
    ``(patch_size*merge_size)^2`` pixels, as in Qwen2-VL); ``tokens_per_image`` gives a fixed count
    (LLaVA, InternVL tiles) used when an image is described only by its pixel size and no patch rule
    is set.
    """

    layers: int
    hidden: int
    ffn_hidden: int
    parameters: float
    patch_size: int = 14
    merge_size: int = 1
    tokens_per_image: int | None = None
    min_tokens: int = 4
    max_tokens: int = 16384

    def __post_init__(self) -> None:
        for name, hint in (
            ("layers", "give the encoder's layer count, e.g. 32."),
            ("hidden", "give the encoder's hidden size, e.g. 1280."),
            ("ffn_hidden", "give the encoder's MLP size, e.g. 5120."),
            ("patch_size", "give the ViT patch size in pixels, e.g. 14."),
            ("merge_size", "give the token merge factor per side (1 when tokens are not merged)."),
            ("min_tokens", "give the smallest visual token count per image."),
            ("max_tokens", "give the largest visual token count per image."),
        ):
            require_int(getattr(self, name), f"model.vision.{name}", hint)
        if self.tokens_per_image is not None:
            require_int(
                self.tokens_per_image,
                "model.vision.tokens_per_image",
                "give the fixed visual token count per image, or leave it out.",
            )
        require_number(self.parameters, "model.vision.parameters", "give the encoder's parameter count, e.g. 6.7e8.")

    def tokens_for_pixels(self, width: int, height: int) -> int:
        """Visual tokens the language model sees for one image of ``width`` x ``height`` pixels."""
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        unit = self.patch_size * self.merge_size
        tokens = -(-width // unit) * -(-height // unit)
        return max(self.min_tokens, min(self.max_tokens, tokens))

    @property
    def patches_per_token(self) -> int:
        """ViT patches (the encoder's sequence) per visual token handed to the language model."""
        return self.merge_size * self.merge_size


@dataclass(frozen=True)
class TrainingSetup:
    """How the job trains, as far as memory and compute are concerned."""

    zero_stage: int = 1
    """0: no sharding; 1: optimizer states sharded over the domain (Megatron distributed optimizer);
    2: gradients too; 3: parameters too (FSDP)."""
    recompute: str = "selective"
    """Activation recomputation: ``none``, ``selective`` (attention recomputed) or ``full``."""

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ProblemError(
                f"must be 0, 1, 2 or 3, got {self.zero_stage!r}",
                field="model.training.zero_stage",
                hint="choose the ZeRO/FSDP sharding stage the job uses.",
            )
        if self.recompute not in ("none", "selective", "full"):
            raise ProblemError(
                f"must be 'none', 'selective' or 'full', got {self.recompute!r}",
                field="model.training.recompute",
                hint="say how activations are recomputed.",
            )


@dataclass(frozen=True)
class ModelSpec:
    """The trained model: a language model and, for multimodal models, its vision encoder."""

    name: str
    llm: LanguageModel
    vision: VisionEncoder | None = None
    training: TrainingSetup = TrainingSetup()
