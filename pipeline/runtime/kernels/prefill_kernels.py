"""The triton backend's prefill: StaticGPT2's forward with its elementwise work fused, for the time
to first token. A 128-token prompt at batch 64 is 8,192 rows: there cuBLAS's products are fast and
what costs is the traffic around them (each layer norm, residual add, GELU or cache copy of
PyTorch's reads and writes the whole [rows, C] stream). So the residual products add into the stream as they write
it (cuBLAS's beta), their biases left to the layer norms after them, which then only read the
stream (StaticGPT2.residual_biases); the first layer norm takes the embedding gathers and their sum
as well; the fc product applies GELU in cuBLASLt's epilogue; and a prompt without padding gets
causal attention that reads q, k and v from the QKV product's output and writes the keys and values
into the cache as it goes (one launch where the cache copy and SDPA's flash kernel took two; a
padded prompt keeps the cache copy, in one launch, and SDPA with a mask).

TritonOps overrides the operations of static_gpt2.TorchOps, which the decode step (and every
backend but this one) uses."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from pipeline.runtime.kernels.linear_kernels import normalized_rows
from pipeline.runtime.kernels.tiles import dot_precision
from pipeline.runtime.kernels.torch_ops import TorchOps

# the causal attention's tiles: queries (and keys) a program takes at a time, warps, pipeline depth;
# the fastest of the sweep on an H200 (docs/journal/decode_notes_h200.md)
ATTENTION_BLOCK, ATTENTION_WARPS, ATTENTION_STAGES = 64, 4, 1


@triton.jit
def _residual_layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, h_ptr, sum_ptr, ids_ptr, positions_ptr, rows, x_stride,
                                y_stride, positions_stride, S, eps, C: tl.constexpr, BLOCK_C: tl.constexpr,
                                ROWS: tl.constexpr, OWED: tl.constexpr, EMBED: tl.constexpr):
    """h[r] = layer_norm(x[r] + y) * w + b, statistics in fp32: x's rows x_stride apart, y [C] fp32
    what the residual stream still owes (OWED), h contiguous [rows, C].
    EMBED: x and y are the token and position embeddings and x[r] is their sum, x[ids[r]] + y[positions[r // S,
    r % S]] (y's rows y_stride apart, positions' positions_stride), rounded as PyTorch's add rounds and
    written to sum [rows, C]."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.arange(0, BLOCK_C)
    inside = (r < rows)[:, None] & (c < C)[None, :]
    if EMBED:
        x_rows = tl.load(ids_ptr + r, mask=r < rows, other=0)
        y_rows = tl.load(positions_ptr + (r // S) * positions_stride + r % S, mask=r < rows, other=0)
        x = tl.load(x_ptr + x_rows[:, None] * x_stride + c[None, :], mask=inside, other=0.0)
        y = tl.load(y_ptr + y_rows[:, None] * y_stride + c[None, :], mask=inside, other=0.0)
        x = (x.to(tl.float32) + y.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + r[:, None] * C + c[None, :], x, mask=inside)
        x = x.to(tl.float32)
    else:
        x = tl.load(x_ptr + r[:, None] * x_stride + c[None, :], mask=inside, other=0.0).to(tl.float32)
        if OWED:
            x += tl.load(y_ptr + c, mask=c < C, other=0.0)[None, :]
    w = tl.load(w_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + c, mask=c < C, other=0.0).to(tl.float32)
    h = normalized_rows(x, inside, C, eps) * w[None, :] + b[None, :]
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


@triton.jit
def _attend_block(q, k, v, best, total, acc, scale, allowed, DOT_PRECISION: tl.constexpr):
    """One key block folded into an online softmax: best, total [BLOCK] are each query's running
    maximum and sum of exponentials (base 2, scale holding log2(e)), acc [BLOCK, D] its weighted sum."""
    s = tl.where(allowed, tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale, float("-inf"))
    new_best = tl.maximum(best, tl.max(s, 1))
    p = tl.math.exp2(s - new_best[:, None])
    correction = tl.math.exp2(best - new_best)  # 0 on the first block: exp2(-inf)
    acc = acc * correction[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return new_best, total * correction + tl.sum(p, 1), acc


@triton.jit
def _causal_attention_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, out_ptr, S, scale, cache_row_stride,
                             cache_head_stride, C: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr,
                             DOT_PRECISION: tl.constexpr):
    """Causal attention of BLOCK queries of one (row, head) of qkv [B, S, 3C] (a prefill from slot 0:
    each position is its slot) into out [B, S, C]: the key blocks before the queries' own without a
    mask, then that diagonal block, whose keys and values this program also writes into the caches
    [B, H, T, D]. Every block is one program's diagonal, so the cache costs no launch of its own and
    no second read of the keys and values."""
    row, head, block = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    d = tl.arange(0, D)
    queries = block * BLOCK + tl.arange(0, BLOCK)
    at = qkv_ptr + row * S * 3 * C + head * D + d[None, :]  # + position * 3C: q, + C: k, + 2C: v
    q = tl.load(at + queries[:, None] * (3 * C), mask=(queries < S)[:, None], other=0.0)
    best = tl.full([BLOCK], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, D], tl.float32)
    for first in range(0, block * BLOCK, BLOCK):
        keys = at + (first + tl.arange(0, BLOCK))[:, None] * (3 * C)
        best, total, acc = _attend_block(q, tl.load(keys + C), tl.load(keys + 2 * C), best, total, acc, scale,
                                         True, DOT_PRECISION)
    # the diagonal block: queries past S (the last block's tail) see zero keys and are not stored
    inside = (queries < S)[:, None]
    k = tl.load(at + C + queries[:, None] * (3 * C), mask=inside, other=0.0)
    v = tl.load(at + 2 * C + queries[:, None] * (3 * C), mask=inside, other=0.0)
    best, total, acc = _attend_block(q, k, v, best, total, acc, scale, queries[None, :] <= queries[:, None],
                                     DOT_PRECISION)
    slots = row * cache_row_stride + head * cache_head_stride + queries[:, None] * D + d[None, :]
    tl.store(k_cache_ptr + slots, k, mask=inside)
    tl.store(v_cache_ptr + slots, v, mask=inside)
    out = acc / total[:, None]
    tl.store(out_ptr + (row * S + queries)[:, None] * C + head * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=inside)


class TritonOps(TorchOps):
    # the products add into the residual stream in place (add_linear), so the layer norms only read it
    defers_residual_biases = True

    @staticmethod
    def layer_norm(x: torch.Tensor, owed: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
        """As TorchOps, in one pass that adds owed (fp32) in registers. x [B, S, C] whose rows are
        evenly spaced (contiguous, or the last position of each row)."""
        c = x.shape[-1]
        rows = x.numel() // c
        h = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        launch_layer_norm(rows, c, x.view(rows, c), owed, weight, bias, h, eps, OWED=owed is not None, EMBED=False)
        return h

    @staticmethod
    def add_linear(x: torch.Tensor, a: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        """As TorchOps, in place: the product adds x as it writes its output (beta 1), so no separate
        add reads x and the product back. x's rows as layer_norm's."""
        c = x.shape[-1]
        x.view(-1, c).addmm_(a.reshape(-1, a.shape[-1]), w.t())
        return x if b is None else x.add_(b)

    @staticmethod
    def embed_layer_norm(wte: torch.Tensor, wpe: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor,
                         weight: torch.Tensor, bias: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        """As TorchOps, in one pass: no [B, S, C] tensor of either embedding alone is written or read
        back. ids and positions [B, S]; rows of positions may repeat (stride 0: one arange for every row)."""
        ids = ids.contiguous()
        if positions.stride(1) != 1:
            positions = positions.contiguous()
        batch, seq = ids.shape
        c = wte.shape[-1]
        x, h = (torch.empty(batch, seq, c, dtype=wte.dtype, device=wte.device) for _ in range(2))
        launch_layer_norm(batch * seq, c, wte, wpe, weight, bias, h, eps, ids, positions, x, OWED=False, EMBED=True)
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

    @staticmethod
    def causal_attention(qkv: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """As TorchOps, in one launch (_causal_attention_kernel); qkv contiguous, head size a power of two."""
        batch, seq, width = qkv.shape
        _, heads, _, head_dim = keys.shape
        out = torch.empty(batch, seq, width // 3, dtype=qkv.dtype, device=qkv.device)
        block = max(16, min(ATTENTION_BLOCK, triton.next_power_of_2(seq)))  # tl.dot takes 16 rows or more
        _causal_attention_kernel[(batch, heads, triton.cdiv(seq, block))](
            qkv, keys, values, out, seq, math.log2(math.e) / math.sqrt(head_dim), keys.stride(0), keys.stride(1),
            C=width // 3, D=head_dim, BLOCK=block, DOT_PRECISION=dot_precision(qkv.dtype),
            num_warps=ATTENTION_WARPS, num_stages=ATTENTION_STAGES)
        return out


def launch_layer_norm(rows: int, c: int, x: torch.Tensor, y: torch.Tensor | None, weight: torch.Tensor,
                      bias: torch.Tensor, h: torch.Tensor, eps: float, ids: torch.Tensor | None = None,
                      positions: torch.Tensor | None = None, sums: torch.Tensor | None = None, **flags) -> None:
    """_residual_layer_norm_kernel over rows rows of width c (flags: OWED, EMBED; EMBED reads ids and
    positions, [B, S] each, and writes sums)."""
    block_c = triton.next_power_of_2(c)
    per_program = max(1, min(16, 4096 // block_c))  # a few rows per program: fewer, fuller programs
    positions_stride, seq = (positions.stride(0), positions.shape[1]) if positions is not None else (0, 1)
    _residual_layer_norm_kernel[(triton.cdiv(rows, per_program),)](
        x, y, weight, bias, h, sums, ids, positions, rows, x.stride(0), 0 if y is None else y.stride(0),
        positions_stride, seq, eps, C=c, BLOCK_C=block_c, ROWS=per_program, num_warps=4, **flags)
