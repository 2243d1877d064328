"""Routing samples to the ranks that need them: a batch sampler and a collate function for a DataLoader.

A rank needs only the samples of its groups (``RankWork.samples``), a small part of the batch when
groups are small. :class:`PlanBatchSampler` yields, step by step, the ids of those samples from the
rank's work of each step (an iterable that may grow while training, as plans arrive one step
ahead); a map-style dataset keyed by sample id loads them; :func:`collate_samples` turns the loaded
items into the ``{sample id: token ids}`` mapping :func:`trainer.step.train_step` takes::

    loader = DataLoader(dataset, batch_sampler=PlanBatchSampler(works), collate_fn=collate_samples)

:class:`SyntheticTokens` is such a dataset of seeded random tokens (each sample's tokens depend only
on the seed and its id, so every process that loads a sample gets the same tokens).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch

from trainer.apply import RankWork


class PlanBatchSampler:
    """For each step's work, the ids of the samples this rank holds (in the order the work uses them)."""

    def __init__(self, works: Iterable[RankWork]) -> None:
        self.works = works

    def __iter__(self) -> Iterator[list[str]]:
        for work in self.works:
            yield list(work.samples)


def collate_samples(items: Sequence[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """[(sample id, token ids)] -> {sample id: int64 token ids}."""
    return {sid: torch.as_tensor(tokens, dtype=torch.int64) for sid, tokens in items}


class SyntheticTokens:
    """A map-style dataset of seeded random token ids: ``dataset[sample_id] -> (sample_id, tokens)``.

    ``lengths`` maps every sample id to its length (the batch index a planner reads); ``loads``
    counts the samples this process loaded, so a check can see that routing loaded only its own.
    """

    def __init__(self, lengths: Mapping[str, int], vocab: int, seed: int = 0) -> None:
        self.lengths = dict(lengths)
        self.vocab = vocab
        self.seed = seed
        self.loads = 0

    def __len__(self) -> int:
        return len(self.lengths)

    def tokens(self, sample_id: str) -> torch.Tensor:
        digest = hashlib.sha256(f"{self.seed}:{sample_id}".encode()).digest()
        gen = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))
        return torch.randint(self.vocab, (self.lengths[sample_id],), generator=gen)

    def __getitem__(self, sample_id: str) -> tuple[str, torch.Tensor]:
        if sample_id not in self.lengths:
            raise KeyError(f"sample {sample_id!r} is not in the dataset")
        self.loads += 1
        return sample_id, self.tokens(sample_id)


def route(work: RankWork, dataset: Any) -> dict[str, torch.Tensor]:
    """This rank's samples of one step, loaded from ``dataset`` (without a DataLoader)."""
    return collate_samples([dataset[sid] for sid in work.samples])
