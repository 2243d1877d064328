"""The arithmetic of context-parallel attention: one key block against this rank's queries, tile by tile.

Precision. Inputs may be float64, float32, bfloat16 or float16; every product and every running
quantity (scores, the softmax's log-sum-exp, the output and the gradients being accumulated) is
kept in float32 (float64 for float64 inputs), as flash-attention kernels do, and only the final
output and gradients are rounded to the input dtype. Masked scores are set to minus infinity in the
accumulator dtype (never a literal that overflows a half-precision type); a tile holds only query
rows that see at least one key, so no row's log-sum-exp is ever infinite.

Grouped-query attention. Queries have H heads, keys and values Hkv heads with H a multiple of
Hkv; query head h reads key/value head h // (H / Hkv) (the order of Hugging Face's ``repeat_kv``).
Queries are viewed as [Hkv, H / Hkv, T, D] and multiplied against [Hkv, 1, T, D] keys by
broadcasting, so keys and values are never copied per query head; their gradients are summed over
the heads that read them.

Tiles. A block is computed over (query rows, key columns, mask) tiles: sample by sample (a query
sees only keys of its own sample) and in runs of at most :data:`TILE` consecutive query positions,
each over only the key columns it can see, so causal attention costs about half the square and a
micro-batch of many short samples costs the sum of their squares. Tiles of different samples that
are small together (at most :data:`TILE` rows and :data:`MERGE_COLUMNS` key columns) are merged into
one tile whose mask is recomputed from positions and samples (block-diagonal across samples): a few
masked products cost less than one more round of small kernels, which is what many short samples
on a wide group would otherwise pay per sample and ring step. A merged tile lists each key column once.

Kernels. A tile's forward runs either as plain products or through torch's fused attention kernel
where torch offers one that returns the log-sum-exp (:data:`KERNELS`); both in the accumulator dtype.
"""

from __future__ import annotations

import os

import torch

TILE = 128
"""Query rows per tile."""

MERGE_COLUMNS = 256
"""Most key columns of a tile merged from several samples' tiles."""

Tiles = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

KERNELS = ("auto", "fused", "matmul")
"""How a tile's forward runs: ``matmul`` (scores, log-sum-exp and output from plain products, in the
accumulator dtype), ``fused`` (torch's fused attention kernel that also returns the log-sum-exp,
run on the tile in the accumulator dtype with the tile's mask as an additive bias: on CPU the flash
kernel ``aten._scaled_dot_product_flash_attention_for_cpu``, on CUDA the memory-efficient kernel
``aten._scaled_dot_product_efficient_attention``, used only once a small tile computed by it matched
the plain products on that device) or ``auto`` (fused where torch offers it for the tensors' device,
else matmul). ``DHP_ATTENTION_KERNEL`` chooses; auto by default.
The backward always recomputes the probabilities from the saved log-sum-exp (both give the same)."""

_CPU_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_CUDA_FUSED = getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None)
_CUDA_CHECKED: dict[str, str | None] = {}
"""Per CUDA device: None when its fused kernel matched the plain products on a probe tile, else why not."""


def cuda_fused_problem(device: torch.device) -> str | None:
    """None when the CUDA fused kernel works on ``device`` (checked once on a probe tile), else the
    reason it is not used."""
    key = str(device)
    if key not in _CUDA_CHECKED:
        _CUDA_CHECKED[key] = _probe_cuda(device)
    return _CUDA_CHECKED[key]


def _probe_cuda(device: torch.device) -> str | None:
    if _CUDA_FUSED is None:
        return f"torch {torch.__version__} has no aten._scaled_dot_product_efficient_attention"
    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(s, generator=g).to(device) for s in ((2, 3, 40, 16), (2, 37, 16), (2, 37, 16)))
        m = (torch.arange(37).unsqueeze(0) <= torch.arange(40).unsqueeze(1) - 3).to(device)
        m[:3, 0] = True
        got_out, got_lse = _cuda_tile(q, k, v, m, 0.25)
        s = torch.matmul(q, k.unsqueeze(1).transpose(-1, -2)) * 0.25
        s = s.masked_fill(~m, -torch.inf)
        lse = torch.logsumexp(s, dim=-1)
        out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.unsqueeze(1))
        err = max(float((got_out - out).abs().max()), float((got_lse - lse).abs().max()))
    except Exception as exc:  # noqa: BLE001 - any failure means: use the plain products
        return (
            f"the fused kernel failed on a probe tile: {type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else exc!r}"
        )
    return None if err < 1e-4 else f"the fused kernel differs from the plain products by {err:.2e} on a probe tile"


def kernel_for(device: torch.device, choice: str | None = None) -> str:
    """The kernel a tile on ``device`` runs: ``fused`` or ``matmul`` (see :data:`KERNELS`)."""
    choice = choice or os.environ.get("DHP_ATTENTION_KERNEL", "auto")
    if choice not in KERNELS:
        raise ValueError(f"DHP_ATTENTION_KERNEL must be one of {KERNELS}, got {choice!r}")
    if choice == "matmul":
        return "matmul"
    if device.type == "cuda":
        problem = cuda_fused_problem(device)
        fused_here = problem is None
    else:
        fused_here = device.type == "cpu" and _CPU_FUSED is not None
        problem = f"no fused attention kernel with a log-sum-exp for {device.type} tensors in torch {torch.__version__}"
    if choice == "fused" and not fused_here:
        raise ValueError(f"{problem}; use matmul or auto")
    return "fused" if choice == "fused" or (choice == "auto" and fused_here) else "matmul"


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64 inputs, float32 for every other floating type."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def mask_value(dtype: torch.dtype) -> float:
    """The most negative finite value of ``dtype``: a masked score that no dtype overflows on."""
    return float(torch.finfo(dtype).min)


def tiles(
    q_pos: torch.Tensor, q_seg: torch.Tensor, k_pos: torch.Tensor, k_seg: torch.Tensor, tile: int | None = None
) -> Tiles:
    """(query rows, key columns, their mask) of each row tile of a block that sees at least one key.

    Built sample by sample, so the cost grows with the sum of squared sample lengths, not the square
    of the total. Tiles never span two samples or two chunks of one, whose rows see very different keys.
    """
    size = tile or TILE
    out: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for s in torch.unique(q_seg).tolist():
        qi = (q_seg == s).nonzero().flatten()
        ki = (k_seg == s).nonzero().flatten()
        if ki.numel() == 0:
            continue
        mask = q_pos[qi][:, None] >= k_pos[ki][None, :]
        live = mask.any(dim=1).nonzero().flatten()
        if live.numel() == 0:
            continue
        pos = q_pos[qi][live]
        breaks = (pos[1:] != pos[:-1] + 1).nonzero().flatten() + 1
        bounds = [0, *breaks.tolist(), int(live.numel())]
        for a, b in zip(bounds[:-1], bounds[1:], strict=False):
            for x in range(a, b, size):
                local = live[x : min(x + size, b)]
                sub = mask[local]
                c = sub.any(dim=0).nonzero().flatten()
                out.append((s, qi[local], ki[c], sub[:, c]))
    return _merge_small(out, size, q_pos, q_seg, k_pos, k_seg)


def _merge_small(
    per_sample: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]],
    size: int,
    q_pos: torch.Tensor,
    q_seg: torch.Tensor,
    k_pos: torch.Tensor,
    k_seg: torch.Tensor,
) -> Tiles:
    """Merge consecutive tiles while their rows fit ``size`` and their distinct key columns MERGE_COLUMNS.

    A merged tile's columns are the union of its parts' (each key once) and its mask is recomputed
    from positions and samples, so it is exactly the parts' attention.
    """
    out: Tiles = []
    run: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []
    rows_in, cols_in = 0, 0

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0][1:])
        elif run:
            rows = torch.cat([r for _, r, _, _ in run])
            cols = torch.unique(torch.cat([c for _, _, c, _ in run]))
            mask = (q_seg[rows][:, None] == k_seg[cols][None, :]) & (q_pos[rows][:, None] >= k_pos[cols][None, :])
            out.append((rows, cols, mask))
        run.clear()

    for item in per_sample:
        r, c = int(item[1].numel()), int(item[2].numel())
        if run and (rows_in + r > size or cols_in + c > MERGE_COLUMNS):
            flush()
            rows_in, cols_in = 0, 0
        run.append(item)
        rows_in, cols_in = rows_in + r, cols_in + c
    flush()
    return out


def grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """[H, T, D] -> [Hkv, H / Hkv, T, D] (a view)."""
    h, t, d = x.shape
    return x.view(kv_heads, h // kv_heads, t, d)


def _fused_tile(
    qr: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, m: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile through the fused kernel: (output [Hkv,G,R,D], log-sum-exp [Hkv,G,R]) of queries
    ``qr`` [Hkv,G,R,D] over keys and values [Hkv,C,D] under mask ``m`` [R,C]. The G query heads of
    a key/value head are stacked as rows, so keys and values are never copied per query head."""
    if qr.device.type == "cuda":
        return _cuda_tile(qr, kc, vc, m, scale)
    assert _CPU_FUSED is not None  # kernel_for chose it
    hkv, g, r, d = qr.shape
    bias = torch.zeros(m.shape, dtype=qr.dtype, device=qr.device).masked_fill_(~m, -torch.inf).repeat(g, 1)
    out, lse = _CPU_FUSED(
        qr.reshape(1, hkv, g * r, d), kc.unsqueeze(0), vc.unsqueeze(0), 0.0, False, attn_mask=bias, scale=scale
    )
    return out.view(hkv, g, r, d), lse.view(hkv, g, r).to(qr.dtype)


def _cuda_tile(
    qr: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, m: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_fused_tile` on CUDA: the memory-efficient kernel, its bias padded to 16 columns (the
    kernel's alignment) and sliced back, its log-sum-exp (rows padded to its block) cut to the rows."""
    assert _CUDA_FUSED is not None
    hkv, g, r, d = qr.shape
    c = kc.shape[1]
    padded = -(-c // 16) * 16
    bias = torch.full((g * r, padded), -torch.inf, dtype=qr.dtype, device=qr.device)
    bias[:, :c].masked_fill_(m.repeat(g, 1), 0.0)
    bias4 = bias[:, :c].unsqueeze(0).unsqueeze(0).expand(1, hkv, g * r, c)
    out, lse = _CUDA_FUSED(
        qr.reshape(1, hkv, g * r, d), kc.unsqueeze(0), vc.unsqueeze(0), bias4, True, 0.0, False, scale=scale
    )[:2]
    return out.view(hkv, g, r, d), lse[..., : g * r].reshape(hkv, g, r).to(qr.dtype)


def block_forward_into(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_tiles: Tiles,
    scale: float,
    kernel: str | None = None,
) -> None:
    """Merge one key block into the running (out [Hkv,G,T,D], lse [Hkv,G,T]) in place.

    ``q`` is [Hkv, G, T, D] and ``k``, ``v`` [Hkv, Tk, D], all in the accumulator dtype;
    ``kernel`` as :data:`KERNELS` (None: ``DHP_ATTENTION_KERNEL``, auto by default).
    """
    fused = kernel_for(q.device, kernel) == "fused"
    for rows, cols, m in block_tiles:
        if fused:
            b_out, b_lse = _fused_tile(q[:, :, rows], k[:, cols], v[:, cols], m, scale)
        else:
            kc, vc = k[:, cols].unsqueeze(1), v[:, cols].unsqueeze(1)
            s = torch.matmul(q[:, :, rows], kc.transpose(-1, -2)) * scale
            s = s.masked_fill(~m, -torch.inf)
            b_lse = torch.logsumexp(s, dim=-1)
            b_out = torch.matmul(torch.exp(s - b_lse.unsqueeze(-1)), vc)
        old = lse[:, :, rows]
        new = torch.logaddexp(old, b_lse)
        out[:, :, rows] = out[:, :, rows] * torch.exp(old - new).unsqueeze(-1) + b_out * torch.exp(
            b_lse - new
        ).unsqueeze(-1)
        lse[:, :, rows] = new


def block_backward_into(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    block_tiles: Tiles,
    scale: float,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
) -> None:
    """Add one block's gradients into dq [Hkv,G,T,D], dk and dv [Hkv,Tk,D] in place, recomputing its probabilities."""
    for rows, cols, m in block_tiles:
        qr, dr = q[:, :, rows], dout[:, :, rows]
        kc, vc = k[:, cols].unsqueeze(1), v[:, cols].unsqueeze(1)
        s = torch.matmul(qr, kc.transpose(-1, -2)) * scale
        p = torch.exp(s - lse[:, :, rows].unsqueeze(-1)).masked_fill(~m, 0.0)
        dv[:, cols] += torch.matmul(p.transpose(-1, -2), dr).sum(1)
        dp = torch.matmul(dr, vc.transpose(-1, -2))
        ds = p * (dp - delta[:, :, rows].unsqueeze(-1))
        dq[:, :, rows] += torch.matmul(ds, kc) * scale
        dk[:, cols] += torch.matmul(ds.transpose(-1, -2), qr).sum(1) * scale
