"""The cost profile: the coefficients every planner and the verifier read.

A profile is the documented exchange format between a trainer that measured its job and the
planner (SI units: seconds, bytes, bytes per second)::

    {"time": {"quadratic": a2, "linear": a1, "sample_constant": a0, "group_constant": b},
     "comm": {"scheme": "ring" | "ulysses" | "hybrid", "bytes_per_token": k,
              "bandwidth_bytes_per_s": {"intra": X, "inter": Y}},
     "capacity_tokens_per_rank": C}

X and Y are each one number or a table by group size (``{"2": 1.2e11, "8": 1.0e11}``), read at the
smallest listed size >= d, or the largest listed size when d is above them all.

A group of size d in one micro-batch takes ``b + sum over its samples of t(L, d)`` with ``t(L, d) =
(a2 L^2 + a1 L + V) / d + a0 + comm(L, d)``; ``comm = 0`` for d = 1, ``k L (d-1)/d / bw`` for ring
and ``k L / d / bw`` for ulysses, bw for the group's span (intra when all its ranks share a node,
else inter). A hybrid group (Ulysses over u ranks inside ring over r = d/u,
:mod:`optimizer.costs.cp_schemes`) sends ``k L (r-1)/d / bw + k_u L / d / bw`` (the second term for
u > 1), with ``k_u`` = ``comm.ulysses_bytes_per_token``, the all-to-all's bytes per token. The
tokens of a micro-batch's samples on a group, divided by d, must not exceed C on every rank of the
group.

Optional extensions (absent means zero / off, so a profile in the base form means exactly the
formula above):

- ``time.vision_linear`` v1 and ``time.vision_quadratic`` v2: V = sum over the sample's images of
  v1 P + v2 P^2, P the image's visual tokens (the vision encoder's work, spread over the group).
- ``comm.latency_s`` ``{"intra": s, "inter": s}`` and ``comm.messages_per_step`` m: adds
  ``m (d-1) latency`` (alpha-beta model: d-1 ring steps, each m messages; ``(r-1) + (u-1)`` steps for
  a hybrid group); ``comm.messages_fixed``
  f adds ``f latency`` more to a sample on a group of d >= 2 ranks (messages a sample's own ring
  exchanges whatever d, as when each sample runs alone).
- ``comm.overlap_with_attention``: when true the ring transfer hides behind the attention it feeds,
  so only ``max(0, comm - a2 L^2 / d)`` is exposed (for a hybrid group, of the ring's part: the
  all-to-all is never hidden).
- ``time.sample_step`` c: each sample adds ``c (d-1)`` (divided by the speed) to a group of d >= 2
  ranks: the fixed work of its pieces in each of the d blocks a ring rank computes.
- ``comm.group_messages`` ``{"per_step": g1, "fixed": g0}``: a group of d >= 2 ranks exchanges
  ``g1 (d-1) + g0`` messages per micro-batch whatever its sample count (a ring trainer sends all its
  samples' keys and values in one message per ring step), adding ``(g1 (d-1) + g0) latency`` to the
  group's constant: the group of size d takes ``b + G(d) + sum t(L, d)``.
- ``comm.padded_bytes``: when true the bytes sent are those of the sample padded as the trainer pads
  it (to a multiple of 2d for ring, d for ulysses; :func:`optimizer.plan.sharding.padded_length`):
  ``k P(L, d) (d-1)/d / bw`` with P the padded length.
- ``time.step_constant`` s: seconds once per step whatever the plan (the gradient all-reduce and the
  optimizer step, measured at the job's rank count); it adds to the predicted step time and to the
  lower bound, and changes no choice.
- ``speed_by_gpu`` ``{"A100": 0.32}``: relative speed of other GPU types in a mixed cluster (the
  profile's own GPU is 1.0); compute terms are divided by the slowest speed in the group.
- ``capacity_tokens_per_rank`` may be a table by GPU type name for mixed clusters.
- ``source``: free text saying where the numbers come from.

A trainer that runs each sample on its own (``options.memory = "sample"``: Megatron-Core's hybrid
context parallelism runs every sub-sample's forward and backward alone, with a barrier between
barrier groups) is described by the same terms: ``time.sample_constant`` is what one sub-sample pays
alone (its own launch), ``time.group_constant`` what each barrier group (micro-batch) pays, and the
ring's messages are the sample's own (``comm.messages_per_step`` and ``comm.messages_fixed``), not
the group's (:func:`trainer.per_sample_costs.per_sample_profile` derives such a profile from a packed fit).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from optimizer.errors import ProblemError
from optimizer.problem.options import CP_SCHEMES


@dataclass(frozen=True)
class Bandwidth:
    """Bandwidth in bytes/s, constant or tabulated by group size."""

    sizes: tuple[int, ...]
    values: tuple[float, ...]

    @classmethod
    def constant(cls, value: float) -> Bandwidth:
        return cls((1,), (float(value),))

    def at(self, d: int) -> float:
        i = bisect.bisect_left(self.sizes, d)
        return self.values[min(i, len(self.values) - 1)]

    def to_json(self) -> float | dict[str, float]:
        if len(self.sizes) == 1 and self.sizes[0] == 1:
            return self.values[0]
        return {str(s): v for s, v in zip(self.sizes, self.values, strict=True)}

    @classmethod
    def from_json(cls, value: Any, where: str) -> Bandwidth:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not value > 0 or not math.isfinite(value):
                raise ProblemError(
                    f"must be a positive number, got {value!r}", field=where, hint="give bytes per second, e.g. 1.0e11."
                )
            return cls.constant(value)
        if isinstance(value, Mapping) and value:
            items = []
            for k, v in value.items():
                try:
                    size = int(k)
                except (TypeError, ValueError):
                    raise ProblemError(
                        f"key {k!r} is not a group size",
                        field=where,
                        hint='key the table by group size, e.g. {"2": 1.2e11, "8": 1.0e11}.',
                    ) from None
                if (
                    size < 1
                    or isinstance(v, bool)
                    or not isinstance(v, (int, float))
                    or not v > 0
                    or not math.isfinite(v)
                ):
                    raise ProblemError(
                        f"entry {k!r}: {v!r} is not a positive bandwidth for a group size >= 1",
                        field=where,
                        hint="give bytes per second per group size.",
                    )
                items.append((size, float(v)))
            items.sort()
            return cls(tuple(s for s, _ in items), tuple(v for _, v in items))
        raise ProblemError(
            f"must be a number or a table by group size, got {value!r}",
            field=where,
            hint='e.g. 1.0e11 or {"2": 1.2e11, "8": 1.0e11}.',
        )


_NUMBER_FIELDS = {
    "quadratic": "time.quadratic",
    "linear": "time.linear",
    "sample_constant": "time.sample_constant",
    "group_constant": "time.group_constant",
    "vision_linear": "time.vision_linear",
    "vision_quadratic": "time.vision_quadratic",
    "sample_step": "time.sample_step",
    "step_constant": "time.step_constant",
    "bytes_per_token": "comm.bytes_per_token",
    "ulysses_bytes_per_token": "comm.ulysses_bytes_per_token",
    "intra_latency": "comm.latency_s.intra",
    "inter_latency": "comm.latency_s.inter",
    "messages_per_step": "comm.messages_per_step",
    "messages_fixed": "comm.messages_fixed",
    "group_messages_per_step": "comm.group_messages.per_step",
    "group_messages_fixed": "comm.group_messages.fixed",
}
"""The profile's numbers that must be finite and >= 0, with their place in the JSON form."""


@dataclass(frozen=True)
class CostProfile:
    """Coefficients of the cost model (see the module docstring for their meaning)."""

    quadratic: float
    linear: float
    sample_constant: float
    group_constant: float
    scheme: str
    bytes_per_token: float
    intra_bandwidth: Bandwidth
    inter_bandwidth: Bandwidth
    capacity_tokens_per_rank: float
    capacity_by_gpu: Mapping[str, float] = field(default_factory=dict)
    vision_linear: float = 0.0
    vision_quadratic: float = 0.0
    intra_latency: float = 0.0
    inter_latency: float = 0.0
    messages_per_step: float = 0.0
    messages_fixed: float = 0.0
    overlap_with_attention: bool = False
    sample_step: float = 0.0
    group_messages_per_step: float = 0.0
    group_messages_fixed: float = 0.0
    padded_bytes: bool = False
    step_constant: float = 0.0
    speed_by_gpu: Mapping[str, float] = field(default_factory=dict)
    ulysses_bytes_per_token: float = 0.0
    source: str = "given"

    def __post_init__(self) -> None:
        for name, path in _NUMBER_FIELDS.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or not math.isfinite(v):
                raise ProblemError(
                    f"must be a finite number >= 0, got {v!r}",
                    field=f"profile.{path}",
                    hint="use SI units (seconds, bytes).",
                )
        if self.scheme not in CP_SCHEMES:
            raise ProblemError(
                f"must be one of {CP_SCHEMES}, got {self.scheme!r}",
                field="profile.comm.scheme",
                hint="use 'ring', 'ulysses' or 'hybrid'.",
            )
        if self.scheme == "hybrid" and not self.ulysses_bytes_per_token > 0:
            raise ProblemError(
                "a hybrid profile needs the all-to-all's bytes per token",
                field="profile.comm.ulysses_bytes_per_token",
                hint="give the bytes a token sends in the all-to-alls (query, key, value and output), e.g. 458752.",
            )
        if (
            isinstance(self.capacity_tokens_per_rank, bool)
            or not isinstance(self.capacity_tokens_per_rank, (int, float))
            or not self.capacity_tokens_per_rank > 0
        ):
            raise ProblemError(
                f"must be a positive number, got {self.capacity_tokens_per_rank!r}",
                field="profile.capacity_tokens_per_rank",
                hint="give the tokens one rank holds in a micro-batch, e.g. 16384.",
            )
        if self.quadratic + self.linear + self.sample_constant <= 0:
            raise ProblemError(
                "quadratic, linear and sample_constant are all zero",
                field="profile.time",
                hint="give at least one positive time coefficient.",
            )
        for name, table in (("capacity_by_gpu", self.capacity_by_gpu), ("speed_by_gpu", self.speed_by_gpu)):
            for k, v in table.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                    raise ProblemError(
                        f"entry {k!r} must be a positive number, got {v!r}",
                        field=f"profile.{name}",
                        hint="key by GPU type name.",
                    )

    def bandwidth(self, d: int, intra: bool) -> float:
        return (self.intra_bandwidth if intra else self.inter_bandwidth).at(d)

    def latency(self, intra: bool) -> float:
        return self.intra_latency if intra else self.inter_latency

    def group_messages(self, d: int) -> float:
        """Messages a group of size d exchanges per micro-batch (0 for a group of one)."""
        return 0.0 if d == 1 else self.group_messages_per_step * (d - 1) + self.group_messages_fixed

    def group_exchange_time(self, d: int, intra: bool) -> float:
        """Seconds a group of size d adds once per micro-batch for its messages (``G(d)`` above)."""
        return self.group_messages(d) * self.latency(intra)

    @property
    def has_group_exchange(self) -> bool:
        return bool(
            (self.group_messages_per_step or self.group_messages_fixed) and (self.intra_latency or self.inter_latency)
        )

    def capacity_for(self, gpu_name: str) -> float:
        return float(self.capacity_by_gpu.get(gpu_name, self.capacity_tokens_per_rank))

    def speed_for(self, gpu_name: str) -> float:
        return float(self.speed_by_gpu.get(gpu_name, 1.0))

    # -- the documented JSON form -------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        time: dict[str, Any] = {
            "quadratic": self.quadratic,
            "linear": self.linear,
            "sample_constant": self.sample_constant,
            "group_constant": self.group_constant,
        }
        if self.vision_linear or self.vision_quadratic:
            time.update(vision_linear=self.vision_linear, vision_quadratic=self.vision_quadratic)
        if self.sample_step:
            time["sample_step"] = self.sample_step
        if self.step_constant:
            time["step_constant"] = self.step_constant
        comm: dict[str, Any] = {
            "scheme": self.scheme,
            "bytes_per_token": self.bytes_per_token,
            **({"ulysses_bytes_per_token": self.ulysses_bytes_per_token} if self.ulysses_bytes_per_token else {}),
            "bandwidth_bytes_per_s": {"intra": self.intra_bandwidth.to_json(), "inter": self.inter_bandwidth.to_json()},
        }
        if self.intra_latency or self.inter_latency or self.messages_per_step:
            comm.update(
                latency_s={"intra": self.intra_latency, "inter": self.inter_latency},
                messages_per_step=self.messages_per_step,
            )
        if self.messages_fixed:
            comm["messages_fixed"] = self.messages_fixed
        if self.overlap_with_attention:
            comm["overlap_with_attention"] = True
        if self.group_messages_per_step or self.group_messages_fixed:
            comm["group_messages"] = {"per_step": self.group_messages_per_step, "fixed": self.group_messages_fixed}
        if self.padded_bytes:
            comm["padded_bytes"] = True
        out: dict[str, Any] = {"time": time, "comm": comm}
        if self.capacity_by_gpu:
            out["capacity_tokens_per_rank"] = {"default": self.capacity_tokens_per_rank, **dict(self.capacity_by_gpu)}
        else:
            out["capacity_tokens_per_rank"] = self.capacity_tokens_per_rank
        if self.speed_by_gpu:
            out["speed_by_gpu"] = dict(self.speed_by_gpu)
        out["source"] = self.source
        return out
