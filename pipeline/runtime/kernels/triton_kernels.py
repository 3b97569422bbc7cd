"""Triton kernels for one GPT-2 decode step, five launches per layer.

At batch 1 to 64 a decode step is bound by kernel launches and by reading the weights once, not by
arithmetic: cuBLAS plus Inductor spend about 11 kernels per layer (layer norms, GEMMs, bias, GELU,
cache writes, split-K reductions, attention), each a few microseconds. Here each layer is:

1. fused_linear(LN1 -> QKV, bias), whose epilogue writes q to a buffer and k/v straight into the
   static cache at the step's slot;
2. decode_attention: one query per (row, head) against the cache with an online softmax, reading
   only the slots up to the step's slot (the filled part of the cache), whatever the cache length;
   at small batch each (row, head) is split over several programs whose last one merges them;
3. fused_linear(attention -> proj, bias, += residual);
4. fused_linear(LN2 -> fc, bias, GELU);
5. fused_linear(fc -> proj, bias, += residual).

fused_linear runs one row as row products (each program a few output columns, its whole K slice
loaded at once: at batch 1 what counts is how many weight bytes are in flight) and more rows as
narrow tensor-core tiles; a layer norm before a product is fused into it, its weight and bias
folded into the product's (the tiles apply it after the product, so that no pass over x holds the
weights back: _tile_product), except above 16 rows before the LM head and, from 1,024 wide, before
QKV and fc, where one small launch normalises x first (layer_norm, head_normalized_apart,
layer_norms_apart). The residual stream is kept in fp32 between kernels; weights, cache and
activations that feed a matrix product are in the model's dtype. The step's slot is read from a
device scalar, so one CUDA graph of these launches serves every step. For greedy decoding the LM head also leaves each
program's row maxima and greedy_advance turns them into the next token and the next step's inputs,
one more launch in place of the host's argmax and input copies.

With pdl (programmatic dependent launch, Hopper and later) a launch may start while the one before
it is still running: each program requests what no launch of this step writes (weights, biases, the
step's slot and counters, the cache slots of earlier steps) first, waits (gdc_wait) before it reads
anything the step writes or writes anything itself, and lets the next launch start
(gdc_launch_dependents) once its own loads are done, so the next launch's programs take
multiprocessors as this one's free them; or, with early, as soon as it starts, where the next
launch has loads of its own to make before its wait: attention's cache after the QKV launch, and
at batch 1 every row product's weight slice, so that the weights of launches to come stream in
while earlier ones compute. A wait returns once the launch before has completed, which it can only
do after its own wait, so every launch before that one has completed too; and what a program
reads before its wait was written before the step began."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pipeline.int8_weights import NARROW_WEIGHTS


@triton.jit
def _embed_kernel(token_ptr, position_ptr, wte_ptr, wpe_ptr, x_ptr, C: tl.constexpr, BLOCK_C: tl.constexpr):
    """x[row] = wte[token[row]] + wpe[position[row]], in fp32."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    inside = c < C
    token = tl.load(token_ptr + row)
    position = tl.load(position_ptr + row)
    e = tl.load(wte_ptr + token * C + c, mask=inside, other=0.0).to(tl.float32)
    e += tl.load(wpe_ptr + position * C + c, mask=inside, other=0.0).to(tl.float32)
    tl.store(x_ptr + row * C + c, e, mask=inside)


@triton.jit
def normalized_rows(x, inside, K: tl.constexpr, eps):
    """A layer norm without its weight and bias of whole rows x [..., BLOCK] fp32 (K values inside
    each): centred before the variance, which rows in registers can afford (a row with mean 300 and
    std 0.5 keeps 2e-6 relative error where the one-pass variance loses 5e-3)."""
    x = tl.where(inside, x - tl.sum(x, -1, keep_dims=True) / K, 0.0)
    return x * (1.0 / tl.sqrt(tl.sum(x * x, -1, keep_dims=True) / K + eps))


@triton.jit
def _layer_norm_kernel(x_ptr, out_ptr, eps, C: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    """out[row] = the layer norm of x[row] without weight and bias (folded into the product after
    it), in out's dtype."""
    row = tl.program_id(0)
    c = tl.arange(0, BLOCK_C)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()  # the product after this waits for it anyway; its launch need not
    x = tl.load(x_ptr + row * C + c, mask=c < C, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * C + c, normalized_rows(x, c < C, C, eps).to(out_ptr.dtype.element_ty), mask=c < C)


@triton.jit
def _int8_as_fp16(w):
    """int8 weights to fp16 four at a time by their bits: each byte, its sign bit flipped, is the low
    byte of the fp16 1,024 + byte + 128, less 1,152 (exact): five instructions for four weights, where a convert per
    weight runs at a quarter of the multiprocessor's rate and left int8 slower than fp8
    (docs/journal/performance.md). Inline PTX: the interpreter converts plainly instead (INT8_BY_BITS)."""
    return tl.inline_asm_elementwise(
        "{ .reg .b32 b, c; xor.b32 b, $2, 0x80808080; mov.b32 c, 0x64806480; "
        "prmt.b32 $0, b, 0x64646464, 0x5150; prmt.b32 $1, b, 0x64646464, 0x5352; "
        "sub.f16x2 $0, $0, c; sub.f16x2 $1, $1, c; }",
        "=r,=r,r", [w], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _tile_product(x_ptr, w_ptr, w_sums_ptr, scale_ptr, rm, rn, row_in, col_in, eps, K: tl.constexpr, LN: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  SPLIT_K: tl.constexpr, REF_COLS: tl.constexpr, SCALED: tl.constexpr, INT8_BY_BITS: tl.constexpr,
                  W_LEFT: tl.constexpr):
    """LN?(x[rm]) @ w[rn]^T over this program's K slice, as tensor-core tiles walked along K.

    W_LEFT: the product taken as (w[rn] @ x[rm]^T)^T, the weights its left operand, which Hopper's
    tensor cores read from registers: one-byte weights converted there go straight into it, whereas
    the right operand they are stored back to shared memory first (docs/journal/performance.md).

    The layer norm takes no pass over x of its own: the product runs on x - r, r each row's mean of
    its first REF_COLS values (close enough to the mean that what is cast for the product is centred
    and keeps its precision), the same tiles give the moments of x - r, and the epilogue applies
    LN(x) @ w^T = rstd * ((x - r) @ w^T - (mean - r) * w_sums), w_sums each output's summed weights.
    A statistics pass first would hold every weight tile back until all of x had arrived. x - r must
    fit the product's dtype, as the residual stream itself must in a model run in that dtype."""
    acc = tl.zeros((BLOCK_N, BLOCK_M) if W_LEFT else (BLOCK_M, BLOCK_N), tl.float32)
    if LN:  # SPLIT_K is 1 here: the slice is the whole row
        rr = tl.arange(0, REF_COLS)
        ref = tl.load(x_ptr + rm[:, None] * K + rr[None, :], mask=row_in[:, None], other=0.0).to(tl.float32)
        ref = tl.sum(ref, 1) / REF_COLS
        w_sums = tl.load(w_sums_ptr + rn, mask=col_in, other=0.0)
        total = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
        squares = tl.zeros((BLOCK_M, BLOCK_K), tl.float32)
    k_slice = tl.program_id(2) * (K // SPLIT_K)
    for k0 in range(0, K // SPLIT_K, BLOCK_K):
        rk = k_slice + k0 + tl.arange(0, BLOCK_K)
        k_in = rk < K
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=row_in[:, None] & k_in[None, :], other=0.0)
        if LN:
            x = tl.where(k_in[None, :], x.to(tl.float32) - ref[:, None], 0.0)
            total += x  # summed across K once, after the loop
            squares += x * x
        w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=col_in[:, None] & k_in[None, :], other=0.0)
        if SCALED:  # int8 or fp8 weights: exact in fp16, the product's type; each output's scale comes after
            w = _int8_as_fp16(w) if INT8_BY_BITS else w.to(tl.float16)
        if W_LEFT:
            acc += tl.dot(w, tl.trans(x.to(w.dtype)), input_precision=DOT_PRECISION)
        else:
            acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision=DOT_PRECISION)
    if W_LEFT:
        acc = tl.trans(acc)
    if SCALED:  # before the layer norm's correction, which takes the scaled (real) weights' sums
        acc *= tl.load(scale_ptr + rn, mask=col_in, other=0.0)[None, :]
    if LN:
        shift = tl.sum(total, 1) / K  # mean - r
        rstd = 1.0 / tl.sqrt(tl.maximum(tl.sum(squares, 1) / K - shift * shift, 0.0) + eps)
        acc = (acc - shift[:, None] * w_sums[None, :]) * rstd[:, None]
    return acc


@triton.jit
def _row_product(x_ptr, w_ptr, row, rn, col_in, eps, K: tl.constexpr, LN: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, PDL: tl.constexpr, INT8_BY_BITS: tl.constexpr):
    """LN?(x[row]) @ w[rn]^T over this program's K slice, [1, BLOCK_N], in CUDA-core FMAs with the
    whole slice in one load (BLOCK_K >= K / SPLIT_K). For one row a step reads each weight once and
    does almost no arithmetic, so what counts is how many of its bytes are in flight: all of them,
    requested before the layer norm waits on x, rather than a few K tiles at a time."""
    k_slice = tl.program_id(2) * (K // SPLIT_K)
    rk = k_slice + tl.arange(0, BLOCK_K)
    k_in = rk < k_slice + K // SPLIT_K
    w = tl.load(w_ptr + rn[:, None] * K + rk[None, :], mask=col_in[:, None] & k_in[None, :], other=0.0)
    if PDL:
        gdc_wait()
    x = tl.load(x_ptr + row * K + rk, mask=k_in, other=0.0).to(tl.float32)
    if LN:  # SPLIT_K is 1 here: the slice is the whole row, in registers
        x = normalized_rows(x, k_in, K, eps)
    if INT8_BY_BITS:
        w = _int8_as_fp16(w)
    return tl.sum(w.to(tl.float32) * x[None, :], 1)[None, :]


@triton.jit
def _fused_linear_kernel(x_ptr, w_ptr, b_ptr, out_ptr, w_sums_ptr, scale_ptr,
                         k_cache_ptr, v_cache_ptr, slot_ptr, cache_row_stride, cache_head_stride,
                         M, N, eps,
                         K: tl.constexpr, C: tl.constexpr, D: tl.constexpr,
                         LN: tl.constexpr, BIAS: tl.constexpr, GELU: tl.constexpr,
                         RESIDUAL: tl.constexpr, QKV: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         best_ptr, best_index_ptr, ARGMAX: tl.constexpr, STORE: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
                         REF_COLS: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr, SCALED: tl.constexpr,
                         INT8_BY_BITS: tl.constexpr, W_LEFT: tl.constexpr):
    """out[M, N] = epilogue(LN?(x[M, K]) @ w[N, K]^T), as tensor-core tiles or, BLOCK_M 1, one row
    per program in row products (_tile_product, _row_product).

    LN: layer norm of each x row (statistics in fp32), its weight and bias folded into w and the
    bias (StaticGPT2(fold_layer_norms=True)); w_sums [>= N] fp32, each row of w summed, is what the
    tiles need for it (_tile_product). RESIDUAL: out += result (out holds the residual stream).
    QKV: columns [0, C) go to out (q), [C, 2C) and [2C, 3C) to the k and v caches [B, H, T, D] at
    slot *slot_ptr. ARGMAX: also each row's largest value in this program's columns and its column
    (the first, on ties) to best / best_index [M, programs along N]; without STORE only those (a
    greedy step's LM head: its fp32 logits are 13 MB a step at batch 64 that nothing reads).
    SPLIT_K > 1 (RESIDUAL only, out fp32): program_id(2) takes one K / SPLIT_K slice and adds its
    partial product into out atomically, so a narrow output still spreads over many programs. The
    order of those fp32 additions is not fixed, so results are not bit-identical from run to run."""
    if PDL and EARLY:
        gdc_launch_dependents()
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_in, col_in = rm < M, rn < N
    # the epilogue's own loads are requested first, so they wait alongside the product's rather than after it
    if BIAS:  # one K slice adds the bias (the slice test as a vector: Triton's interpreter refuses a scalar there)
        bias = tl.load(b_ptr + rn, mask=col_in & (tl.zeros_like(rn) + tl.program_id(2) == 0), other=0.0)
    if QKV:
        slot = tl.load(slot_ptr)
    if BLOCK_M == 1:
        acc = _row_product(x_ptr, w_ptr, tl.program_id(0), rn, col_in, eps, K, LN, BLOCK_K, SPLIT_K, PDL, INT8_BY_BITS)
        if SCALED:
            acc *= tl.load(scale_ptr + rn, mask=col_in, other=0.0)[None, :]
    else:
        if PDL:
            gdc_wait()
        acc = _tile_product(x_ptr, w_ptr, w_sums_ptr, scale_ptr, rm, rn, row_in, col_in, eps, K, LN, DOT_PRECISION,
                            BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, REF_COLS, SCALED, INT8_BY_BITS, W_LEFT)
    if PDL and not EARLY:  # this program's loads are done: the next launch may take multiprocessors as they free
        gdc_launch_dependents()
    if BIAS:
        acc += bias.to(tl.float32)[None, :]
    if GELU:
        # GELU's tanh form: 0.5 * (1 + tanh(u)) == sigmoid(2u), with 2u = 2 * sqrt(2 / pi) * (x + 0.044715 x^3)
        acc = acc / (1.0 + tl.exp(-1.5957691216057308 * (acc + 0.044715 * acc * acc * acc)))
    inside = row_in[:, None] & col_in[None, :]
    if QKV:
        part = rn // C
        within = rn % C
        cached = rm[:, None] * cache_row_stride + (within // D)[None, :] * cache_head_stride + slot * D + (within % D)[None, :]
        value = acc.to(k_cache_ptr.dtype.element_ty)
        tl.store(out_ptr + rm[:, None] * C + within[None, :], value, mask=inside & (part == 0)[None, :])
        tl.store(k_cache_ptr + cached, value, mask=inside & (part == 1)[None, :])
        tl.store(v_cache_ptr + cached, value, mask=inside & (part == 2)[None, :])
    else:
        out = out_ptr + rm[:, None] * N + rn[None, :]
        if SPLIT_K > 1:
            tl.atomic_add(out, acc, mask=inside, sem="relaxed")
        elif STORE:
            if RESIDUAL:
                acc += tl.load(out, mask=inside, other=0.0).to(tl.float32)
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=inside)
        if ARGMAX:
            best, column = tl.max(tl.where(col_in[None, :], acc, float("-inf")), 1, return_indices=True,
                                  return_indices_tie_break_left=True)
            partial = rm * tl.num_programs(1) + tl.program_id(1)
            tl.store(best_ptr + partial, best, mask=row_in)
            tl.store(best_index_ptr + partial, tl.program_id(1) * BLOCK_N + column, mask=row_in)


@triton.jit
def _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, wanted, T: tl.constexpr, D: tl.constexpr):
    """The keys, values and slot-mask entries of slots t of one (row, head), those wanted only (zero elsewhere)."""
    offsets = cache + t[:, None] * D + tl.arange(0, D)[None, :]
    keys = tl.load(k_cache_ptr + offsets, mask=wanted[:, None], other=0.0)
    values = tl.load(v_cache_ptr + offsets, mask=wanted[:, None], other=0.0)
    return keys, values, tl.load(slot_mask_ptr + row * T + t, mask=wanted, other=0)


@triton.jit
def _online_softmax(keys, values, live, q, m_i, l_i, acc):
    """One block of slots into the running max m_i, sum l_i and weighted values acc (fp32)."""
    s = tl.where(live, tl.sum(keys.to(tl.float32) * q[None, :], 1), float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    p = tl.exp(s - m_new)
    alpha = tl.exp(m_i - m_new)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * values.to(tl.float32), 0)


@triton.jit
def _finish_attention(acc, m_i, l_i, out_ptr, partial_ptr, arrivals_ptr, row, head, d, H: tl.constexpr,
                      D: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr):
    """A program's running max, sum and weighted values into out[row, head]: directly, or through
    partial, the last of the (row, head)'s SPLITS programs to arrive merging them all."""
    out = out_ptr + row * H * D + head * D + d
    if SPLITS == 1:
        tl.store(out, (acc / l_i).to(out_ptr.dtype.element_ty))
    else:
        pair = row * H + head
        mine = partial_ptr + (pair * SPLITS + tl.program_id(2)) * (D + 2)
        tl.store(mine + d, acc)
        tl.store(mine + D + tl.arange(0, 1), m_i)
        tl.store(mine + D + 1 + tl.arange(0, 1), l_i)
        tl.debug_barrier()  # every thread's stores above come before the release below
        if tl.atomic_add(arrivals_ptr + pair, 1, sem="acq_rel") == SPLITS - 1:
            tl.debug_barrier()  # and the acquire before any thread's loads of the others' partials
            tl.store(arrivals_ptr + pair, 0)
            i = tl.arange(0, BLOCK_S)
            parts = partial_ptr + (pair * SPLITS + i) * (D + 2)
            m = tl.load(parts + D, mask=i < SPLITS, other=-float("inf"))
            weight = tl.exp(m - tl.max(m, 0))
            total = tl.sum(tl.load(parts + D + 1, mask=i < SPLITS, other=0.0) * weight, 0)
            values = tl.load(parts[:, None] + d[None, :], mask=(i < SPLITS)[:, None], other=0.0)
            tl.store(out, (tl.sum(values * weight[:, None], 0) / total).to(out_ptr.dtype.element_ty))


@triton.jit
def _decode_attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, slot_mask_ptr, slot_ptr, first_ptr, out_ptr,
                             partial_ptr, arrivals_ptr, cache_row_stride, cache_head_stride, scale,
                             T: tl.constexpr, H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr,
                             SHARE: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, FILLED: tl.constexpr,
                             FETCH_AHEAD: tl.constexpr, PDL: tl.constexpr, EARLY: tl.constexpr):
    """out[row, head] = softmax(q . k[t] * scale over live slots t) . v, for t <= slot whose
    slot_mask is set (the query's own slot always counts): only the filled part of the cache is read.

    The slots before the step's were written by earlier steps, so a program requests its first
    block of them before it waits for the launch before (which writes q and the step's own slot),
    and each block's successor while it computes on the block: the cache streams in rather than
    arriving one dependent block at a time (FETCH_AHEAD). The own slot starts the online softmax.
    Without FETCH_AHEAD each block is loaded where it is used, all after the wait: fewer registers
    a program, and at 64 rows of 16 heads or more the faster walk (attention_config).

    SPLITS > 1 (flash-decoding): program_id(2) takes the slots [share * i, share * (i + 1)) and
    leaves its running max, sum and weighted values in partial [B, H, SPLITS, D + 2]; the last of a
    (row, head)'s programs to finish, counted in arrivals [B, H] (left zeroed), merges them, so the
    merge costs no launch. Shares are fixed slices of the cache (SHARE): a program past the step's
    slot has nothing to do, but every load's alignment and the walk's length are known at compile
    time (equal parts of the filled slots measured 3-10% slower per step where the cache is mostly
    filled). FILLED: shares of the row's filled slots, from its first (first_ptr [B]: no slot before
    it is live) up to the step's, in whole blocks, for a cache much wider than its filled part (the
    serving scheduler's, whose rows of all ages share one column), where fixed slices left one
    program a (row, head) to walk every filled slot, and without splits walked the whole cache's
    blocks (masked) to its end (docs/journal/performance.md)."""
    if PDL and EARLY:
        gdc_launch_dependents()
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    slot = tl.load(slot_ptr)
    if FILLED:  # whole blocks, so every share starts block-aligned
        base = tl.load(first_ptr + row) // BLOCK_T * BLOCK_T
        share = tl.cdiv(slot + 1 - base, SPLITS * BLOCK_T) * BLOCK_T
        lo = tl.multiple_of(base + tl.program_id(2) * share, BLOCK_T)
    else:
        share = SHARE
        lo = tl.program_id(2) * SHARE
    cache = row * cache_row_stride + head * cache_head_stride
    end = tl.minimum(lo + share, slot)  # this share's slots before the step's own
    if FETCH_AHEAD:
        t = lo + tl.arange(0, BLOCK_T)
        earlier = t < end
        k_next, v_next, real_next = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, earlier, T, D)
    if PDL:
        gdc_wait()
    q = tl.load(q_ptr + row * H * D + head * D + d).to(tl.float32) * scale
    has_own = (slot >= lo) & (slot < lo + share)  # this program's share holds the step's own slot
    own = cache + slot * D + d
    # has_own as a vector: Triton's interpreter refuses a scalar mask
    has_own_d = (tl.zeros_like(d) + slot >= lo) & (tl.zeros_like(d) + slot < lo + share)
    k_own = tl.load(k_cache_ptr + own, mask=has_own_d, other=0.0).to(tl.float32)
    acc = tl.load(v_cache_ptr + own, mask=has_own_d, other=0.0).to(tl.float32)
    # -1e30 rather than -inf where the own slot is not here: a block with no live slot then adds
    # exp(-inf) = 0, never inf - inf
    m_i = tl.where(has_own, tl.sum(k_own * q, 0), -1e30) + tl.zeros((1,), tl.float32)
    l_i = tl.where(has_own, 1.0, 0.0) + tl.zeros((1,), tl.float32)
    if FETCH_AHEAD:
        for _ in range(tl.cdiv(share, BLOCK_T)):
            keys, values, live = k_next, v_next, earlier & (real_next != 0)
            t += BLOCK_T
            earlier = t < end
            k_next, v_next, real_next = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, earlier,
                                                     T, D)
            m_i, l_i, acc = _online_softmax(keys, values, live, q, m_i, l_i, acc)
    else:
        for start in range(lo, end, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)
            keys, values, real = _cache_block(k_cache_ptr, v_cache_ptr, slot_mask_ptr, cache, row, t, t < end, T, D)
            m_i, l_i, acc = _online_softmax(keys, values, (t < end) & (real != 0), q, m_i, l_i, acc)
    if PDL and not EARLY:
        gdc_launch_dependents()
    _finish_attention(acc, m_i, l_i, out_ptr, partial_ptr, arrivals_ptr, row, head, d, H, D, SPLITS, BLOCK_S)


@triton.jit
def _row_inputs(row, step_ptr, start_ptr, position_ptr, advance_ptr, wpe_ptr, POSITIONS, C: tl.constexpr,
                BLOCK_C: tl.constexpr, EMBED: tl.constexpr):
    """What a step's tail (_advance_row) reads that the step does not write, loaded first so that the
    loads wait together: (step, start, the row's next position, its position embedding, the columns)."""
    step = tl.load(step_ptr)
    start = tl.load(start_ptr)
    position = tl.load(position_ptr + row) + tl.load(advance_ptr + row)
    c = tl.arange(0, BLOCK_C)
    e = tl.zeros([BLOCK_C], dtype=tl.float32)
    if EMBED:  # past the last position nothing runs the step: any row in range will do
        e = tl.load(wpe_ptr + tl.minimum(position, POSITIONS - 1) * C + c, mask=c < C, other=0.0).to(tl.float32)
    return step, start, position, e, c


@triton.jit
def _advance_row(row, token, step, start, position, e, c, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr,
                 position_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, x_ptr, B, T, C: tl.constexpr,
                 EMBED: tl.constexpr):
    """A step's tail for one row once its token is picked: the token becomes the row's next input and
    tokens[row, step]; the row's position advances and its slot (start) is marked real for the steps
    after it (attention counts a query's own slot unmarked). The last row to arrive advances the
    shared start and step (every row has read them by then). EMBED: also the next step's input
    x[row] = wte[token] + wpe[position] (fp32, as _embed_kernel), so that the next step starts with
    its first layer rather than a launch of its own; x's last reader, the LM head, has completed."""
    tl.store(token_ptr + row, token)
    tl.store(tokens_ptr + row * row_stride + step * step_stride, token)
    if EMBED:
        e += tl.load(wte_ptr + token * C + c, mask=c < C, other=0.0).to(tl.float32)
        tl.store(x_ptr + row * C + c, e, mask=c < C)
    tl.store(position_ptr + row, position)
    tl.store(slot_mask_ptr + row * T + start, 1)
    if tl.atomic_add(arrivals_ptr, 1, sem="acq_rel") == B - 1:
        tl.store(start_ptr, start + 1)
        tl.store(step_ptr, step + 1)
        tl.store(arrivals_ptr, 0)


@triton.jit
def _greedy_advance_kernel(best_ptr, best_index_ptr, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr, position_ptr,
                           advance_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, wpe_ptr, x_ptr, B, T, POSITIONS,
                           PARTIALS: tl.constexpr, BLOCK: tl.constexpr, C: tl.constexpr, BLOCK_C: tl.constexpr,
                           EMBED: tl.constexpr, PDL: tl.constexpr):
    """For one row: the argmax of its logits from the LM head's per-program maxima (the first
    column on ties, as torch.argmax), then the step's tail (_advance_row)."""
    row = tl.program_id(0)
    i = tl.arange(0, BLOCK)
    step, start, position, e, c = _row_inputs(row, step_ptr, start_ptr, position_ptr, advance_ptr, wpe_ptr, POSITIONS,
                                              C, BLOCK_C, EMBED)
    if PDL:
        gdc_wait()
    best = tl.load(best_ptr + row * PARTIALS + i, mask=i < PARTIALS, other=float("-inf"))
    column = tl.load(best_index_ptr + row * PARTIALS + i, mask=i < PARTIALS, other=0)
    token = tl.sum(tl.where(i == tl.argmax(best, 0, tie_break_left=True), column, 0), 0).to(tl.int64)
    _advance_row(row, token, step, start, position, e, c, token_ptr, tokens_ptr, row_stride, step_stride, step_ptr,
                 position_ptr, start_ptr, slot_mask_ptr, arrivals_ptr, wte_ptr, x_ptr, B, T, C, EMBED)


@dataclass(frozen=True)
class LinearConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    warps: int = 4
    stages: int = 3
    weights_left: bool = False  # the weights as the tensor-core product's left operand (_tile_product's W_LEFT)


def head_normalized_apart(m: int) -> bool:
    """Whether the LM head over m rows takes them normalised by a launch of its own (layer_norm)
    rather than normalising in its tiles. Above 16 rows its tiles then take all rows at once (64 x
    128), reading each of the head's weights once, x in half the bytes and no norm arithmetic; at
    batch 8 that bought nothing, so up to 16 rows the tiles keep the norm (docs/journal/performance.md)."""
    return m > 16


def layer_norms_apart(m: int, width: int, narrow: bool = False) -> bool:
    """Whether the QKV and fc products over m rows take x normalised by a launch of their own
    (layer_norm), as the LM head does above 16 rows: above 16 rows from gpt2-medium's width up, from
    gpt2-large's for one-byte weights (narrow). Their tiles then read x in fp16 with no norm
    arithmetic, and 64-row tiles read each weight once: at 64 rows gpt2-large's fp16 step 2.08 -> 1.80
    ms and gpt2-xl's 3.92 -> 3.13, for two launches more a layer; gpt2-medium's 1.045-1.081 -> 1.019-1.020
    under deeper tiles (int8-wo lost 4% in one A/B, 0-5% faster in another); at 124M's width and at
    8 rows the fused norm was as fast or faster (docs/journal/performance.md, "the layer norms apart",
    "weight bytes in flight")."""
    return m > 16 and width >= (1280 if narrow else 1024)


def linear_config(m: int, n: int, k: int, residual: bool, narrow: bool = False, fp32: bool = False) -> LinearConfig:
    """Tile sizes for one fused linear, chosen by timing every GPT-2 124M shape at batch 1, 8 and 64
    on an H200 (docs/journal/decode_notes_h200.md has the sweeps), then the wider models' (1,024 to
    1,600: `width` below) product by product (docs/journal/performance.md, "tiles for the wider
    shapes"). A decode step's matrices are far too small to fill 132 multiprocessors with big tiles.
    One row (batch 1) takes row products: 4-8 output columns per program, 576 to 6,288 programs for
    GPT-2 124M, each loading its whole K slice at once, with fewer warps the longer the slice. More
    rows take narrow tensor-core tiles and, where the epilogue is a plain sum (the residual
    projections), split K, so that each launch runs 70 to 400 programs. narrow: one-byte weights
    (int8, fp8), whose tiles differ where their own sweep found better (_one_byte_config); fp32:
    four-byte operands, which keep the tiles whose stages fit in shared memory at four bytes."""
    width = n if residual else k  # the model's: the residual projections write it, the others read it
    wide = width >= 1024 and n <= 8192  # the LM head keeps its tiles at every width
    if wide and not residual and layer_norms_apart(m, width, narrow):  # all rows a tile: each weight read once
        if narrow or fp32:  # one-byte weights gained nothing from deeper tiles in the step; fp32's would not fit
            return LinearConfig(64, 32, 128 if k % 128 == 0 else 64, stages=4)
        # each program walks K a tile at a time, so the weight bytes in flight (about N x stages x BLOCK_K
        # x 2) set the pace: at 1,600 wide 128-wide K tiles (the last half masked) six deep with the weights
        # on the left hold 7.4 MB where 64-wide ones 4 deep held 2.5 (QKV alone 9.9 -> 7.9 us); at 1,024 six
        # stages hold 4.7 MB (3.1 at four); at 1,280, where four hold 3.9-5.2 MB, six lost 3% of the batch-64
        # step (docs/journal/performance.md, "weight bytes in flight")
        if k % 128:
            return LinearConfig(64, 64, 128, stages=6, weights_left=True)
        return LinearConfig(64, 32, 128, stages=6 if k < 1280 else 4)
    if narrow and (config := _one_byte_config(m, n, k, residual, wide)):
        return config
    if m == 1:
        if residual and wide:
            return LinearConfig(1, 8, 0, _row_split(k), warps=2 if k >= 5120 else 4)
        if residual:  # K slices of 64-256 (768 / 12, 3072 / 12): among the sweep's best for both projections
            split = max((s for s in (2, 3, 4, 6, 8, 12) if k % s == 0 and k // s >= 64), default=1)
            return LinearConfig(1, 8, 0, split)
        if wide:
            return LinearConfig(1, 4, 0, warps=1 if width >= 1280 else 2)
        return LinearConfig(1, 8, 0, warps=2) if n > 8192 else LinearConfig(1, 4, 0)
    block_k = min(128, triton.next_power_of_2(k))
    small = m <= 16
    if residual:
        if wide and small and width < 1600:  # at 8 rows 64-wide K tiles split up to 8 ways, 32 columns a tile
            return LinearConfig(16, 32, *_k_split(k, 64))
        block_k, split = _k_split(k, block_k)
        if small:
            return LinearConfig(16, 16, block_k, split, warps=4)
        return LinearConfig(64 if k > 1024 else 32, 32, block_k, split, warps=4)
    # above 16 rows, pipeline depths chosen inside the whole batch-64 greedy step, not per kernel: the
    # QKV and fc tiles 4 stages deep, the head 3, so that its programs fit in one wave (docs/journal/decode_notes_h200.md)
    if n > 8192:  # the LM head
        if head_normalized_apart(m):
            return LinearConfig(64, 128, 64, warps=4, stages=3)
        return LinearConfig(16, 256, 64, warps=8, stages=4)
    if small:
        return LinearConfig(16, 32, block_k, warps=4)
    if wide and k % 128:  # 1,600: K tiles that divide K, 32 rows a tile
        return LinearConfig(32, 128, 64, warps=4, stages=3)
    return LinearConfig(16, 128, block_k, warps=4, stages=4)


def _one_byte_config(m: int, n: int, k: int, residual: bool, wide: bool) -> LinearConfig | None:
    """Tiles for int8 / fp8 weights where their sweep at every width beat fp16's and the whole step
    agreed (docs/journal/performance.md, "one-byte weights"); None where fp16's are as good. The
    residual products: 128-wide K tiles split into whole tiles, 32 columns a tile (64 above 16 rows).
    Above 16 rows the QKV and fc products' 16 x 128 tiles four stages deep (below gpt2-large's width:
    from it up their norms go apart and all rows take one tile, layer_norms_apart(narrow)); at 2-16
    rows the LM head's 16 x 128 tiles (its 256-wide ones wait longer on the conversion). One row keeps
    fp16's: four warps a row product won alone and lost in the step (gpt2-xl 1.13 -> 1.28 ms)."""
    if m == 1:
        return None
    if n > 8192:
        return LinearConfig(16, 128, 64) if m <= 16 else None
    if residual:
        return LinearConfig(32 if wide and m > 16 else 16, 32 if m <= 16 else 64, *_k_split(k, 128))
    if m > 16:
        return LinearConfig(16, 128, 128 if k % 128 == 0 else 64, stages=4)
    return None


def _row_split(k: int) -> int:
    """K slices for a wide model's row product (each program loads its slice padded to a power of
    two): the fewest padded lanes, then the slice nearest 256 (1,024 -> 4, 4,096 -> 8, 1,280 -> 5,
    5,120 -> 5, 1,600 -> 8, 6,400 -> 8: the sweep's best)."""
    def cost(s: int) -> tuple[float, float]:
        return triton.next_power_of_2(k // s) / (k // s), abs(math.log2(k / s / 256))
    return min((s for s in (8, 5, 4, 2) if k % s == 0), key=cost, default=1)


def _k_split(k: int, block_k: int) -> tuple[int, int]:
    """The K tile and the most K slices (of 1-8) that cut K into whole tiles, the tile halved until
    one does: 768 and 3072 (124M) keep 128-wide tiles in 6 and 8 slices; gpt2-xl's 1600 takes 64-wide
    ones in 5. K with no such tile (odd) runs unsplit, masked."""
    while block_k >= 16:
        splits = [s for s in (8, 6, 5, 4, 3, 2, 1) if k % (s * block_k) == 0]
        if splits:
            return block_k, splits[0]
        block_k //= 2
    return min(128, triton.next_power_of_2(k)), 1


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision for operands of this dtype: fp32 stays exact (its 1e-5 budget) rather
    than taking TF32; fp16 and bf16 ignore it."""
    return "ieee" if dtype == torch.float32 else "tf32"


def fused_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None, bias: torch.Tensor | None = None,
                 ln: tuple[torch.Tensor, float] | None = None, gelu: bool = False,
                 residual: bool = False, qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None,
                 n: int | None = None, config: LinearConfig | None = None,
                 argmax: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
                 early: bool = False, scale: torch.Tensor | None = None) -> None:
    """out = epilogue(LN?(x) @ w[:n]^T + bias). x [M, K] contiguous; w [>= n, K]; ln = (w_sums, eps)
    for a layer norm whose weight and bias are folded into w and bias, w_sums = w.float().sum(1) (the
    tiles normalise after the product); qkv = (k_cache, v_cache, slot tensor, head_dim) routes the
    output as _fused_linear_kernel describes; argmax = (best fp32, best_index int32), each
    [M, argmax_partials(...)], gets each program's row maxima (greedy_advance reduces them), and with
    out None only those. config
    overrides the tuned tiles (tests, tuning). pdl: programmatic dependent launch, early: with the next
    launch let start at once rather than after this one's loads (module docstring). scale: fp32 [>= n],
    with int8 or fp8 w (int8_weights.quantize_rows): each output's scale, applied to the product in registers (the
    weights are read in one byte each, half fp16's); ln's w_sums are then the scaled weights' sums."""
    m, k = x.shape
    n = w.shape[0] if n is None else n
    cfg = config or linear_config(m, n, k, residual, narrow=w.dtype in NARROW_WEIGHTS, fp32=w.dtype == torch.float32)
    if cfg.block_m == 1:  # row products: each program loads its whole K slice, so block_k is not a choice
        block_k, k_step = triton.next_power_of_2(k // cfg.split_k), 1
    else:
        block_k = k_step = min(cfg.block_k, triton.next_power_of_2(k))
    splittable = residual and ln is None and out.dtype == torch.float32 and k % (cfg.split_k * k_step) == 0
    if cfg.split_k > 1 and not splittable:
        # a layer norm needs whole rows: a row product over a K slice would take its statistics from the slice
        raise ValueError(f"split_k={cfg.split_k} needs a residual fp32 output, no layer norm, and K ({k}) a multiple "
                         "of split_k * block_k")
    # a pointer argument the kernel's flags leave unused still needs a tensor: w stands in
    w_sums, eps = ln if ln is not None else (w, 0.0)
    if ln is not None and w_sums.shape != (w.shape[0],):
        raise ValueError(f"ln's w_sums is {tuple(w_sums.shape)}: it must be w.float().sum(1), one per row of w")
    k_cache, v_cache, slot, head_dim = qkv if qkv is not None else (w, w, w, 16)
    c = n // 3 if qkv is not None else n
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), cfg.split_k)
    if argmax is not None and (cfg.split_k > 1 or residual or qkv is not None or argmax[0].shape != (m, grid[1])):
        raise ValueError(f"argmax needs a plain product and buffers of shape {(m, grid[1])}")
    if out is None and argmax is None:
        raise ValueError("out is None: only a product that leaves its argmax may skip its output")
    best, best_index = argmax if argmax is not None else (w, w)
    if (scale is None) != (w.dtype not in NARROW_WEIGHTS):
        raise ValueError(f"w is {w.dtype}: int8 and fp8 weights take their scale, fp16 and fp32 ones none")
    _fused_linear_kernel[grid](
        x, w, bias if bias is not None else w, out if out is not None else w, w_sums, scale if scale is not None else w,
        k_cache, v_cache, slot, k_cache.stride(0), k_cache.stride(1) if qkv is not None else 0,
        m, n, eps, K=k, C=c, D=head_dim,
        LN=ln is not None, BIAS=bias is not None, GELU=gelu, RESIDUAL=residual,
        QKV=qkv is not None,
        DOT_PRECISION=dot_precision(w.dtype),
        best_ptr=best, best_index_ptr=best_index, ARGMAX=argmax is not None, STORE=out is not None,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, SPLIT_K=cfg.split_k,
        REF_COLS=min(64, 1 << (k.bit_length() - 1)),  # a power of two, at most K
        PDL=pdl, EARLY=early, SCALED=scale is not None,
        INT8_BY_BITS=w.dtype == torch.int8 and w.is_cuda,  # inline PTX: the interpreter converts plainly
        W_LEFT=cfg.weights_left, launch_pdl=pdl, num_warps=cfg.warps, num_stages=cfg.stages)


@dataclass(frozen=True)
class AttentionConfig:
    splits: int  # programs per (row, head), each over its share of the filled slots
    warps: int
    block_t: int = 256  # slots per step of a program's walk over its share (at most)
    registers: int | None = None  # a cap per thread, where more programs per multiprocessor pay (ptxas' maxnreg)
    fetch_ahead: bool = True  # each next block requested while one is computed on, the first before the PDL wait


def attention_config(batch: int, heads: int, filled: bool = False) -> AttentionConfig:
    """Chosen by timing the whole decode step at batch 1, 8 and 64 on an H200 (docs/journal/decode_notes_h200.md),
    at 124M's 12 heads first, then at every shape (docs/journal/performance.md, "the layer norms apart"):
    a few rows leave most multiprocessors idle unless each head's cache walk is split, into one-warp
    programs at batch 1 (faster alone at every head count; gpt2-medium's step 8% faster). At batch 64
    the 3,072 one-warp programs fit the 132 multiprocessors at once only at 80 registers or fewer
    (25 a multiprocessor; uncapped the kernel takes 96, and a second wave costs 15 us a step); with
    20 and 25 heads (gpt2-large, gpt2-xl) 4 splits make 1.5-2 waves, and 2 splits were 2-4% faster
    a step (with 16, gpt2-medium's, 4-6% slower: 4 splits are 1.24 waves there). From 16 heads at 64
    rows, one program a (row, head) walking 32-slot blocks, each loaded where it is used (no block
    fetched ahead), took 6-9% off the step against those (gpt2-medium, large, xl; at 12 heads it was
    no faster alone); at 25 heads it reads the cache at 86% of a kernel that only reads those bytes
    (performance.md, "attention at 64 rows without its block fetched ahead").
    `filled` (the FILLED shares, the serving scheduler's): one-warp programs over 16-slot blocks, more
    of them the fewer the rows, and no cap: its walk needs 74-76 registers, and under a cap ptxas
    spills it (docs/journal/performance.md, "the FILLED attention without its register cap")."""
    if filled:
        return AttentionConfig(splits=16 if batch <= 4 else 8 if batch <= 16 else 4, warps=1, block_t=16)
    if batch <= 4:
        return AttentionConfig(splits=8, warps=1, block_t=32, registers=80)
    if batch <= 16:
        return AttentionConfig(splits=1, warps=8)
    if batch * heads <= 768:
        return AttentionConfig(splits=4, warps=1, block_t=16, registers=80)
    return AttentionConfig(splits=1, warps=1, block_t=32, fetch_ahead=False)


def attention_partials(batch: int, heads: int, head_dim: int, config: AttentionConfig | None = None) -> torch.Size:
    """The shape of decode_attention's partial buffer for this batch (fp32)."""
    return torch.Size((batch, heads, (config or attention_config(batch, heads=heads)).splits, head_dim + 2))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mask: torch.Tensor,
                     slot: torch.Tensor, out: torch.Tensor, partial: torch.Tensor, arrivals: torch.Tensor,
                     config: AttentionConfig | None = None, pdl: bool = False, early: bool = False,
                     first: torch.Tensor | None = None) -> None:
    """q/out [B, H * D]; caches [B, H, T, D] contiguous; slot_mask [B, T]; slot a device scalar;
    partial fp32 of attention_partials(...) and arrivals int32 [B, H] zeros, the split programs'
    meeting place (see _decode_attention_kernel). config overrides the tuned one; pdl and early as
    fused_linear; first, each row's first filled slot [B] int64 (at most slot): the shares split
    each row's filled slots from there rather than the cache (its FILLED)."""
    batch, heads, length, head_dim = k_cache.shape
    cfg = config or attention_config(batch, filled=first is not None, heads=heads)
    needed = attention_partials(batch, heads, head_dim, cfg)
    if partial.shape != needed:
        raise ValueError(f"partial is {tuple(partial.shape)}; this batch and config need {tuple(needed)}")
    share = triton.cdiv(length, cfg.splits)
    _decode_attention_kernel[(batch, heads, cfg.splits)](
        q, k_cache, v_cache, slot_mask, slot, slot if first is None else first, out, partial, arrivals,
        k_cache.stride(0), k_cache.stride(1),
        head_dim ** -0.5, T=length, H=heads, D=head_dim,
        BLOCK_T=min(cfg.block_t, triton.next_power_of_2(share)), SHARE=share, SPLITS=cfg.splits,
        BLOCK_S=triton.next_power_of_2(cfg.splits), FILLED=first is not None, FETCH_AHEAD=cfg.fetch_ahead, PDL=pdl, EARLY=early,
        launch_pdl=pdl, num_warps=cfg.warps,
        **({"maxnreg": cfg.registers} if cfg.registers else {}))


def layer_norm(x: torch.Tensor, out: torch.Tensor, eps: float, pdl: bool = False) -> None:
    """out [M, C] = each row of x [M, C] normalised (a layer norm whose weight and bias are folded into
    the product after it), in out's dtype; pdl as fused_linear."""
    c = x.shape[1]
    _layer_norm_kernel[(x.shape[0],)](x, out, eps, C=c, BLOCK_C=triton.next_power_of_2(c), PDL=pdl, launch_pdl=pdl)


def embed(token: torch.Tensor, position: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, x: torch.Tensor) -> None:
    c = x.shape[1]
    _embed_kernel[(x.shape[0],)](token, position, wte, wpe, x, C=c, BLOCK_C=triton.next_power_of_2(c))


def argmax_partials(m: int, vocab: int, k: int, narrow: bool = False) -> int:
    """How many per-program maxima fused_linear(..., argmax=) writes per row for an LM head of this
    shape (narrow: over int8 or fp8 weights)."""
    return triton.cdiv(vocab, linear_config(m, vocab, k, residual=False, narrow=narrow).block_n)


def greedy_advance(best: torch.Tensor, best_index: torch.Tensor, token: torch.Tensor, tokens: torch.Tensor,
                   step: torch.Tensor, position: torch.Tensor, advance: torch.Tensor, start: torch.Tensor,
                   slot_mask: torch.Tensor, arrivals: torch.Tensor,
                   embedding: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, pdl: bool = False) -> None:
    """The greedy step's tail in one launch (see _greedy_advance_kernel). best / best_index [B, P] from
    fused_linear(..., argmax=); token / position / advance [B, 1]; tokens [B, N]; step [1]; start a scalar;
    slot_mask [B, T] bool; arrivals an int32 counter, zero between launches; embedding = (wte, wpe,
    x [B, C] fp32): write the next step's input as embed() would; pdl as fused_linear."""
    batch, partials = best.shape
    wte, wpe, x = embedding if embedding is not None else (best, best, best)  # stand-ins when not EMBED
    c = x.shape[1] if embedding is not None else 1
    _greedy_advance_kernel[(batch,)](best, best_index, token, tokens, tokens.stride(0), tokens.stride(1), step, position, advance,
                                     start, slot_mask, arrivals, wte, wpe, x, batch, slot_mask.shape[1], wpe.shape[0],
                                     PARTIALS=partials, BLOCK=triton.next_power_of_2(partials), C=c,
                                     BLOCK_C=triton.next_power_of_2(c), EMBED=embedding is not None, PDL=pdl,
                                     launch_pdl=pdl)
