"""The decode step's products and norms: fused_linear (a layer norm, the product, bias, GELU,
residual or the QKV routing into the cache, and the LM head's per-program argmax, in one launch),
the layer norm for the shapes that take it apart, and the first step's embedding. The tiles each
product takes are tiles.linear_config's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from pipeline.int8_weights import NARROW_WEIGHTS
from pipeline.runtime.kernels import tiles
from pipeline.runtime.kernels.tiles import LinearConfig, dot_precision


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


def fused_linear(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor | None, bias: torch.Tensor | None = None,
                 ln: tuple[torch.Tensor, float] | None = None, gelu: bool = False,
                 residual: bool = False, qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int] | None = None,
                 n: int | None = None, config: LinearConfig | None = None,
                 argmax: tuple[torch.Tensor, torch.Tensor] | None = None, pdl: bool = False,
                 early: bool = False, scale: torch.Tensor | None = None, fixed_order: bool = False) -> None:
    """out = epilogue(LN?(x) @ w[:n]^T + bias). x [M, K] contiguous; w [>= n, K]; ln = (w_sums, eps)
    for a layer norm whose weight and bias are folded into w and bias, w_sums = w.float().sum(1) (the
    tiles normalise after the product); qkv = (k_cache, v_cache, slot tensor, head_dim) routes the
    output as _fused_linear_kernel describes; argmax = (best fp32, best_index int32), each
    [M, argmax_partials(...)], gets each program's row maxima (greedy_advance reduces them), and with
    out None only those. config
    overrides the tuned tiles (tests, tuning). pdl: programmatic dependent launch, early: with the next
    launch let start at once rather than after this one's loads (module docstring). scale: fp32 [>= n],
    with int8 or fp8 w (int8_weights.quantize_rows): each output's scale, applied to the product in registers (the
    weights are read in one byte each, half fp16's); ln's w_sums are then the scaled weights' sums.
    fixed_order: the tuned tiles without split-K (tiles.fixed_order), for a sum in one order every run."""
    m, k = x.shape
    n = w.shape[0] if n is None else n
    cfg = config or tiles.linear_config(m, n, k, residual, narrow=w.dtype in NARROW_WEIGHTS, fp32=w.dtype == torch.float32)
    if fixed_order:
        cfg = tiles.fixed_order(cfg)
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


def layer_norm(x: torch.Tensor, out: torch.Tensor, eps: float, pdl: bool = False) -> None:
    """out [M, C] = each row of x [M, C] normalised (a layer norm whose weight and bias are folded into
    the product after it), in out's dtype; pdl as fused_linear."""
    c = x.shape[1]
    _layer_norm_kernel[(x.shape[0],)](x, out, eps, C=c, BLOCK_C=triton.next_power_of_2(c), PDL=pdl, launch_pdl=pdl)


def embed(token: torch.Tensor, position: torch.Tensor, wte: torch.Tensor, wpe: torch.Tensor, x: torch.Tensor) -> None:
    c = x.shape[1]
    _embed_kernel[(x.shape[0],)](token, position, wte, wpe, x, C=c, BLOCK_C=triton.next_power_of_2(c))
