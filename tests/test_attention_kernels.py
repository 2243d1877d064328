"""The fused per-tile attention kernel gives what the plain products give (output and log-sum-exp),
for one sample and many merged short ones, grouped-query heads included."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from trainer.attention_tiles import block_backward_into, block_forward_into, kernel_for, tiles  # noqa: E402


def _block(lengths: list[int], dtype: torch.dtype, kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    total, kv_heads, group, dim = sum(lengths), 2, 3, 16
    seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
    pos = torch.cat([torch.arange(n) for n in lengths])
    q = torch.randn(kv_heads, group, total, dim, generator=gen, dtype=dtype)
    k = torch.randn(kv_heads, total, dim, generator=gen, dtype=dtype)
    v = torch.randn(kv_heads, total, dim, generator=gen, dtype=dtype)
    out = torch.zeros(kv_heads, group, total, dim, dtype=dtype)
    lse = torch.full((kv_heads, group, total), -torch.inf, dtype=dtype)
    block_forward_into(out, lse, q, k, v, tiles(pos, seg, pos, seg), 0.25, kernel=kernel)
    return out, lse


@pytest.mark.parametrize("lengths", [[300], [40, 13, 5, 97, 2, 31]])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_fused_tiles_equal_plain_products(lengths, dtype, tol):
    if kernel_for(torch.device("cpu")) != "fused":
        pytest.skip("this torch offers no fused CPU kernel with a log-sum-exp")
    out_m, lse_m = _block(lengths, dtype, "matmul")
    out_f, lse_f = _block(lengths, dtype, "fused")
    assert lse_f.dtype == dtype and torch.isfinite(lse_f).all()
    assert (out_m - out_f).abs().max().item() < tol
    assert (lse_m - lse_f).abs().max().item() < tol


def test_backward_from_either_forward_is_the_same():
    """The backward recomputes from the saved log-sum-exp, so both forwards give the same gradients."""
    if kernel_for(torch.device("cpu")) != "fused":
        pytest.skip("no fused CPU kernel")
    lengths = [50, 9, 30]
    grads = []
    for kernel in ("matmul", "fused"):
        gen = torch.Generator().manual_seed(3)
        total = sum(lengths)
        seg = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
        pos = torch.cat([torch.arange(n) for n in lengths])
        q = torch.randn(1, 2, total, 8, generator=gen, dtype=torch.float64)
        k, v = (
            torch.randn(1, total, 8, generator=gen, dtype=torch.float64),
            torch.randn(1, total, 8, generator=gen, dtype=torch.float64),
        )
        dout = torch.randn(1, 2, total, 8, generator=gen, dtype=torch.float64)
        out = torch.zeros_like(q)
        lse = torch.full((1, 2, total), -torch.inf, dtype=torch.float64)
        t = tiles(pos, seg, pos, seg)
        block_forward_into(out, lse, q, k, v, t, 0.3, kernel=kernel)
        delta = (dout * out).sum(-1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        block_backward_into(q, k, v, dout, lse, delta, t, 0.3, dq, dk, dv)
        grads.append((dq, dk, dv))
    for a, b in zip(*grads, strict=True):
        assert (a - b).abs().max().item() < 1e-12


def test_kernel_choice_is_checked(monkeypatch):
    monkeypatch.setenv("DHP_ATTENTION_KERNEL", "flash3")
    with pytest.raises(ValueError, match="DHP_ATTENTION_KERNEL"):
        kernel_for(torch.device("cpu"))
    monkeypatch.setenv("DHP_ATTENTION_KERNEL", "matmul")
    assert kernel_for(torch.device("cpu")) == "matmul"
    with pytest.raises(ValueError, match="no fused attention kernel"):
        kernel_for(torch.device("meta"), "fused")


def _efficient_attention_stand_in(q, k, v, bias, compute_lse, dropout, causal, scale):
    """What CUDA's memory-efficient kernel returns, computed on CPU: the output and a log-sum-exp whose
    rows are padded to 32."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
    lse = torch.logsumexp(s, dim=-1)
    rows = lse.shape[-1]
    padded = torch.full((*lse.shape[:-1], -(-rows // 32) * 32), float("nan"))
    padded[..., :rows] = lse
    return torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v), padded, None, None


def test_cuda_tile_wrapper_lays_out_heads_bias_and_log_sum_exp(monkeypatch):
    """The CUDA tile path (GQA heads stacked as rows, the bias padded to 16 columns and sliced back, the
    log-sum-exp cut to the rows) checked on CPU with a stand-in for the kernel: the probe accepts it,
    and a stand-in that drops the mask is refused with the reason."""
    from trainer import attention_tiles

    monkeypatch.setattr(attention_tiles, "_CUDA_FUSED", _efficient_attention_stand_in)
    assert attention_tiles._probe_cuda(torch.device("cpu")) is None

    def unmasked(q, k, v, bias, *rest, scale):
        return _efficient_attention_stand_in(q, k, v, torch.zeros_like(bias), *rest, scale)

    monkeypatch.setattr(attention_tiles, "_CUDA_FUSED", unmasked)
    assert "differs from the plain products" in attention_tiles._probe_cuda(torch.device("cpu"))
    monkeypatch.setattr(attention_tiles, "_CUDA_FUSED", None)
    assert "has no" in attention_tiles._probe_cuda(torch.device("cpu"))
