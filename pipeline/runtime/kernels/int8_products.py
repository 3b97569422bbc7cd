"""The prefill's products on int8-wo's own weights, so that int8-wo holds no float copy of its
matrices: a tiled product that loads each weight tile as int8, widens it to the activations' type in
registers and scales each output column once, after the sum (the scale is per output). The bias,
GELU and the residual add are its epilogue, as cuBLASLt's are in TritonOps.

Int8WeightOps is TritonOps with its products taken by this kernel; the weights are RowScaled."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pipeline.runtime.kernels.prefill_kernels import TritonOps
from pipeline.runtime.kernels.tiles import dot_precision


@dataclass(frozen=True)
class RowScaled:
    """int8 weights q [..., N, K] and a scale per output [..., N]: the weight is q * scale[..., None].
    Indexing takes a layer of stacked ones, as a float tensor's does."""
    q: torch.Tensor
    scale: torch.Tensor  # fp32

    def __getitem__(self, index) -> RowScaled:
        return RowScaled(self.q[index], self.scale[index])

    @property
    def shape(self) -> torch.Size:
        return self.q.shape


@triton.jit
def _int8_weight_product_kernel(a_ptr, q_ptr, scale_ptr, bias_ptr, out_ptr, M, N, K, a_stride, out_stride,
                                BIAS: tl.constexpr, GELU: tl.constexpr, ACCUMULATE: tl.constexpr,
                                DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """out[M, N] (+)= epilogue((a[M, K] @ q[N, K]^T) * scale[N]): ACCUMULATE adds out's own values (the
    residual stream, in place). Programs go down GROUP_M row tiles of a column of tiles before the next
    column, so a weight tile is read from L2 by the row tiles that share it."""
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * grid_n
    first = (pid // per_group) * GROUP_M
    rows_in_group = tl.minimum(grid_m - first, GROUP_M)
    pid_m = first + (pid % per_group) % rows_in_group
    pid_n = (pid % per_group) // rows_in_group
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptr + rm[:, None] * a_stride + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(q_ptr + rn[None, :] * K + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K), other=0)
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=DOT_PRECISION)
    acc = acc * tl.load(scale_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if GELU:  # the tanh form, as linear_kernels' (0.5 * (1 + tanh(u)) == sigmoid(2u))
        acc = acc / (1.0 + tl.exp(-1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)))
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    out = out_ptr + rm[:, None] * out_stride + rn[None, :]
    if ACCUMULATE:
        acc += tl.load(out, mask=inside, other=0.0).to(tl.float32)
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=inside)


def int8_weight_product(a: torch.Tensor, w: RowScaled, bias: torch.Tensor | None = None, gelu: bool = False,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """a [..., K] @ (w.q * w.scale)^T (+ bias, GELU) -> [..., N] in a's type; given `out` (a's leading
    shape, rows evenly spaced), the product is added into it in place. a's rows evenly spaced too."""
    k, n = a.shape[-1], w.q.shape[0]
    rows = a.numel() // k
    a2, accumulate = a.reshape(rows, k), out is not None
    if out is None:
        out = torch.empty(*a.shape[:-1], n, dtype=a.dtype, device=a.device)
    o2 = out.view(rows, n)  # the last position of each row too: a [B, 1, C] view's rows are one stride apart
    # a prompt of rows x 128 tokens fills the device with 128-row tiles; a few rows (the last positions) take 64
    block_m = 128 if rows > 256 else 64
    block_n, block_k = 128, 64
    grid = (triton.cdiv(rows, block_m) * triton.cdiv(n, block_n),)
    _int8_weight_product_kernel[grid](a2, w.q, w.scale, bias, o2, rows, n, k, a2.stride(0), o2.stride(0),
                                      BIAS=bias is not None, GELU=gelu, ACCUMULATE=accumulate,
                                      DOT_PRECISION=dot_precision(a.dtype), BLOCK_M=block_m, BLOCK_N=block_n,
                                      BLOCK_K=block_k, GROUP_M=8, num_warps=8 if block_m == 128 else 4, num_stages=3)
    return out


class Int8WeightOps(TritonOps):
    """TritonOps whose products take RowScaled weights (int8_weight_product)."""

    @staticmethod
    def linear(h: torch.Tensor, w: RowScaled, b: torch.Tensor | None) -> torch.Tensor:
        return int8_weight_product(h, w, b)

    @staticmethod
    def add_linear(x: torch.Tensor, a: torch.Tensor, w: RowScaled, b: torch.Tensor | None) -> torch.Tensor:
        return int8_weight_product(a, w, b, out=x)

    @staticmethod
    def linear_gelu(h: torch.Tensor, w: RowScaled, b: torch.Tensor) -> torch.Tensor:
        return int8_weight_product(h, w, b, gelu=True)
