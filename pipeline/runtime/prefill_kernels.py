"""The triton backend's prefill: StaticGPT2's forward with its elementwise work fused, for the time
to first token. A 128-token prompt at batch 64 is 8,192 rows: there cuBLAS's products are fast and
what costs is the traffic around them (on an H200 each layer norm, residual add, GELU or cache copy
of PyTorch's reads and writes 12-25 MB). So each layer norm takes the residual add before it (one
pass over x instead of two), the fc product applies GELU in cuBLASLt's epilogue, and the keys and
values go into the cache in one launch from the QKV product's output instead of two strided copies.

TritonOps overrides the three operations of static_gpt2.TorchOps, which the decode step (and every
backend but this one) uses."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pipeline.runtime.static_gpt2 import TorchOps
from pipeline.runtime.triton_kernels import normalized_rows


@triton.jit
def _add_layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, h_ptr, rows, x_stride, y_stride, eps, C: tl.constexpr,
                           BLOCK_C: tl.constexpr, ROWS: tl.constexpr, ADD: tl.constexpr):
    """x[r] += y[r] (in x's dtype, rounded as PyTorch's add rounds), then h[r] = layer_norm(x[r]) * w + b,
    statistics in fp32. h is contiguous [rows, C]; x and y rows are x_stride / y_stride apart."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_C)
    inside = (r < rows)[:, None] & (c < C)[None, :]
    x_at = x_ptr + r[:, None] * x_stride + c[None, :]
    x = tl.load(x_at, mask=inside, other=0.0)
    if ADD:
        y = tl.load(y_ptr + r[:, None] * y_stride + c[None, :], mask=inside, other=0.0)
        x = (x.to(tl.float32) + y.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(x_at, x, mask=inside)
    w = tl.load(w_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    h = normalized_rows(x.to(tl.float32), inside, C, eps) * w[None, :] + b[None, :]
    tl.store(h_ptr + r[:, None] * C + c[None, :], h.to(h_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _write_cache_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, S, start, cache_row_stride, cache_head_stride,
                        C: tl.constexpr, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """The keys and values of BLOCK_S positions of one (row, head) from qkv [B, S, 3C] into the caches
    [B, H, T, D] at slots start.. (each a contiguous run of slots there)."""
    row, head = tl.program_id(0), tl.program_id(1)
    s = tl.program_id(2) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    inside = (s < S)[:, None]
    source = qkv_ptr + (row * S + s)[:, None] * (3 * C) + head * D + d[None, :]
    target = row * cache_row_stride + head * cache_head_stride + (start + s)[:, None] * D + d[None, :]
    keys = tl.load(source + C, mask=inside)
    values = tl.load(source + 2 * C, mask=inside)
    tl.store(k_cache_ptr + target, keys, mask=inside)
    tl.store(v_cache_ptr + target, values, mask=inside)


class TritonOps(TorchOps):
    @staticmethod
    def add_layer_norm(x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, layer_norm(x + y)) as TorchOps, in one pass; x is updated in place. x, y [B, S, C]
        whose rows are evenly spaced (contiguous, or the last position of each row)."""
        c = x.shape[-1]
        rows = x.numel() // c
        x2, y2 = x.view(rows, c), (y if y is not None else x).view(rows, c)
        h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        block_c = triton.next_power_of_2(c)
        per_program = max(1, min(16, 4096 // block_c))  # a few rows per program: fewer, fuller programs
        _add_layer_norm_kernel[(triton.cdiv(rows, per_program),)](
            x2, y2, weight, bias, h, rows, x2.stride(0), y2.stride(0), eps, C=c, BLOCK_C=block_c,
            ROWS=per_program, ADD=y is not None, num_warps=4)
        return x, h

    @staticmethod
    def linear_gelu(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """GELU(h @ w^T + b), GPT-2's tanh form. On a GPU in the product's epilogue: cuBLASLt's GELU is
        the tanh form, applied in fp32 before the cast (on a CPU torch's fused op takes the erf form)."""
        if not h.is_cuda:
            return TorchOps.linear_gelu(h, w, b)
        rows = h.numel() // h.shape[-1]
        return torch._addmm_activation(b, h.view(rows, -1), w.t(), use_gelu=True).view(*h.shape[:-1], -1)

    @staticmethod
    def write_cache(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int, slots: torch.Tensor) -> None:
        """Keys and values of qkv [B, S, 3C] (contiguous) into slots start..start + S of the caches."""
        batch, seq, width = qkv.shape
        _, heads, _, head_dim = keys.shape
        block_s = min(64, triton.next_power_of_2(seq))
        _write_cache_kernel[(batch, heads, triton.cdiv(seq, block_s))](
            qkv, keys, values, seq, start, keys.stride(0), keys.stride(1), C=width // 3, D=head_dim, BLOCK_S=block_s)
