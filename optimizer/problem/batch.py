"""A global batch: samples of text tokens and images or video frames."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING

from optimizer.errors import ProblemError

if TYPE_CHECKING:
    import numpy as np

MAX_TOKENS = 10**9
"""Largest token or frame count of one field (a billion: far above any sample, far below overflow)."""
MAX_SAMPLE_TOKENS = 10**12
"""Largest sequence length of one sample: fields within their own limits can multiply past 64-bit integers
(a billion frames of a billion tokens); no cluster holds a sample of this length anyway."""
MAX_BATCH_TOKENS = 10**15
"""Largest sum of sequence lengths of a batch, so that sums of lengths stay exact in 64-bit integers and floats."""


@dataclass(frozen=True)
class Image:
    """An image, or ``frames`` video frames of the same size: visual tokens per frame as the
    language model sees them."""

    tokens: int
    frames: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or isinstance(self.tokens, bool) or not 1 <= self.tokens <= MAX_TOKENS:
            raise ProblemError(
                f"must be an integer >= 1, got {self.tokens!r}",
                field="images[].tokens",
                hint="give the visual token count, or width and height in pixels.",
            )
        if not isinstance(self.frames, int) or isinstance(self.frames, bool) or not 1 <= self.frames <= MAX_TOKENS:
            raise ProblemError(
                f"must be an integer >= 1, got {self.frames!r}",
                field="images[].frames",
                hint="give the number of video frames (1 for a still image).",
            )

    @property
    def total_tokens(self) -> int:
        return self.tokens * self.frames


@dataclass(frozen=True)
class Sample:
    """One training sample; its sequence length is text tokens plus all visual tokens."""

    id: str
    text_tokens: int
    images: tuple[Image, ...] = ()
    visual_tokens: int = field(init=False, repr=False, compare=False)
    """All visual tokens of the sample's images and frames."""
    length: int = field(init=False, repr=False, compare=False)
    """Sequence length seen by the language model: text plus visual tokens."""

    def __post_init__(self) -> None:
        images = tuple(self.images)
        object.__setattr__(self, "images", images)
        if not isinstance(self.id, str) or not self.id:
            raise ProblemError(
                "must be a non-empty string", field="samples[].id", hint="give every sample a unique id."
            )
        if (
            not isinstance(self.text_tokens, int)
            or isinstance(self.text_tokens, bool)
            or not 0 <= self.text_tokens <= MAX_TOKENS
        ):
            raise ProblemError(
                f"must be an integer >= 0, got {self.text_tokens!r}",
                field=f"samples[{self.id}].text_tokens",
                hint="give the number of text tokens.",
            )
        visual = sum(im.tokens * im.frames for im in images)
        object.__setattr__(self, "visual_tokens", visual)
        object.__setattr__(self, "length", self.text_tokens + visual)
        if self.length < 1:
            raise ProblemError(
                "has no tokens", field=f"samples[{self.id}]", hint="give text_tokens > 0 or at least one image."
            )
        if self.length > MAX_SAMPLE_TOKENS:
            raise ProblemError(
                f"has {self.length} tokens, more than the {MAX_SAMPLE_TOKENS:.0e} a sample may have",
                field=f"samples[{self.id}]",
                hint="check the frame and token counts of its images and videos.",
            )

    @classmethod
    def checked(cls, id: str, text_tokens: int, images: tuple[Image, ...], visual_tokens: int) -> Sample:
        """A sample whose fields the caller has already checked as ``__post_init__`` would (a
        non-empty str id, int counts in range, at least one token): built without checking again.
        Used by the document reader's fast path, where per-sample checks dominate reading a batch."""
        sample = object.__new__(cls)
        sample.__dict__.update(
            id=id,
            text_tokens=text_tokens,
            images=images,
            visual_tokens=visual_tokens,
            length=text_tokens + visual_tokens,
        )
        return sample


@dataclass(frozen=True)
class ImageArrays:
    """The images of a batch as flat arrays: sample i's are ``start[i]:start[i + 1]`` of ``tokens``
    (visual tokens per frame) and ``frames``, in the sample's order."""

    start: np.ndarray
    tokens: np.ndarray
    frames: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        """[n] images per sample."""
        return self.start[1:] - self.start[:-1]


@dataclass(frozen=True)
class Batch:
    """A global batch. Sample ids are unique."""

    samples: tuple[Sample, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", tuple(self.samples))
        if not self.samples:
            raise ProblemError("is empty", field="batch.samples", hint="send at least one sample.")
        seen: dict[str, int] = {}
        for k, s in enumerate(self.samples):
            first = seen.setdefault(s.id, k)
            if first != k:
                raise ProblemError(
                    f"sample id {s.id!r} is also the id of samples[{first}]",
                    field=f"batch.samples[{k}].id",
                    hint=(
                        "make every sample id unique (or leave an id out: the sample is then named after its position)."
                    ),
                )
        total = sum(s.length for s in self.samples)
        if total > MAX_BATCH_TOKENS:
            raise ProblemError(
                f"have {total} tokens in all, more than the {MAX_BATCH_TOKENS:.0e} a batch may have",
                field="batch.samples",
                hint="split the batch, or check the frame and token counts of its samples.",
            )

    def __len__(self) -> int:
        return len(self.samples)

    @cached_property
    def lengths(self) -> tuple[int, ...]:
        return tuple(map(attrgetter("length"), self.samples))

    @cached_property
    def images(self) -> ImageArrays:
        """Every sample's images as arrays (read once per batch by the cost tables and the verifier alike)."""
        import numpy as np  # the engine's dependency: the command line reads batches without it

        per_sample = list(map(attrgetter("images"), self.samples))
        start = np.zeros(len(per_sample) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, per_sample), dtype=np.int64, count=len(per_sample)), out=start[1:])
        both = np.fromiter(
            chain.from_iterable(map(attrgetter("tokens", "frames"), chain.from_iterable(per_sample))),
            dtype=np.int64,
            count=2 * int(start[-1]),
        )
        return ImageArrays(start=start, tokens=both[0::2].copy(), frames=both[1::2].copy())

    @cached_property
    def ids(self) -> np.ndarray:
        """The sample ids as an object array, in batch order (read once per batch by the plan builder
        and the verifier)."""
        import numpy as np  # the engine's dependency: the command line reads batches without it

        return np.fromiter(map(attrgetter("id"), self.samples), dtype=object, count=len(self.samples))

    @cached_property
    def index(self) -> dict[str, int]:
        return {s.id: i for i, s in enumerate(self.samples)}
