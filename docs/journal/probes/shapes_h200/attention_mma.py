"""Is decode attention at 8 and 64 rows bound by its arithmetic rather than its bytes (#50)?

kv8_attention.py found one-byte caches no faster at 64 rows (int8 0.91-1.13x fp16's time, fp8
2.3-2.7x slower) although they halve the bytes. The shipped walk converts every key and value to
fp32 and multiplies on the CUDA cores (two converts and two FMAs per cached element, plus the
reductions), and fp8's slower convert made it slower still. (cache_stream.py then showed the fp16
walk reading at about 78% of what a bare read of the same bytes reaches.)

Two walks against the shipped one, each over the same caches (slot 191 of 256, each (row, head)'s
own slot apart as the shipped kernel takes it):
- mma: the query repeated into a 16-row tile (tensor cores take no fewer rows), q.K^T and P.V as
  tensor-core products on the fp16 cache as stored (no converts), P rounded to fp16 as
  flash-attention does; the walk a tl.range of `stages`, so the compiler streams the blocks in.
- mma8: the mma walk over int8 caches with an fp32 scale a (slot, head) (the fp16 caches rounded),
  each byte made fp16 by its bits (_int8_as_fp16), the scales on the scores and the probabilities;
  its error against the shipped kernel's is the rounding's and the walk's together.
- pipelined: the shipped CUDA-core arithmetic, its walk a tl.range of `stages` instead of one block
  fetched ahead by hand. (Its `stages` changed nothing: triton 3.6 compiles the same code for 1, 2
  and 3 stages of a loop whose loads feed no tensor-core product, checked for sm90 on the CPU; so it
  is a walk that loads each block where it is used, and its 2- against 3-stage times are noise.)
Each under a grid of (splits, warps, block_t, stages), alone, in a CUDA graph of 20 launches over
enough caches (>= 200 MB) that none is still in L2 -> us a launch, the shipped config's, the best
three of each walk, and the best's output against the shipped kernel's (relative error).
python3 docs/journal/probes/shapes_h200/attention_mma.py"""

import collections
import itertools
import sys

import torch
import triton
import triton.language as tl
from graph_timing import graph_us, sweep_times

from pipeline.runtime.kernels.decode_attention import _finish_attention
from pipeline.runtime.kernels.linear_kernels import _int8_as_fp16

LENGTH, D, SLOT = 256, 64, 191
CASES = [(12, 64), (16, 64), (20, 64), (25, 64), (16, 8), (25, 8)]  # (heads, batch)


@triton.jit
def _attention_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, slot_mask_ptr, slot_ptr, out_ptr,
                      partial_ptr, arrivals_ptr, cache_row_stride, cache_head_stride, scale, T: tl.constexpr,
                      H: tl.constexpr, D: tl.constexpr, BLOCK_T: tl.constexpr, SHARE: tl.constexpr,
                      SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, STAGES: tl.constexpr, MMA: tl.constexpr,
                      KV8: tl.constexpr):
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, D)
    slot = tl.load(slot_ptr)
    lo = tl.program_id(2) * SHARE
    hi = tl.minimum(lo + SHARE, slot)  # the earlier slots of this share: [lo, hi)
    cache = row * cache_row_stride + head * cache_head_stride
    q = tl.load(q_ptr + row * H * D + head * D + d)
    has_own = (tl.zeros_like(d) + slot >= lo) & (tl.zeros_like(d) + slot < lo + SHARE)
    own = cache + slot * D + d
    k_own = tl.load(k_cache_ptr + own, mask=has_own, other=0.0).to(tl.float32)
    v_own = tl.load(v_cache_ptr + own, mask=has_own, other=0.0).to(tl.float32)
    if KV8:
        scales = (cache // D) + slot + tl.zeros_like(d)
        k_own *= tl.load(k_scale_ptr + scales, mask=has_own, other=0.0)
        v_own *= tl.load(v_scale_ptr + scales, mask=has_own, other=0.0)
    s_own = tl.sum(k_own * q.to(tl.float32), 0) * scale
    here = (slot >= lo) & (slot < lo + SHARE)
    if MMA:
        r = tl.arange(0, 16)
        q16 = tl.where(r[:, None] == 0, q[None, :], 0.0).to(q_ptr.dtype.element_ty)
        m_i = tl.where(here, s_own, -1e30) + tl.zeros((16,), tl.float32)
        l_i = tl.where(here, 1.0, 0.0) + tl.zeros((16,), tl.float32)
        acc = v_own[None, :] + tl.zeros((16, D), tl.float32)
        for start in tl.range(lo, hi, BLOCK_T, num_stages=STAGES):
            t = start + tl.arange(0, BLOCK_T)
            inside = t < hi
            offsets = cache + t[:, None] * D + d[None, :]
            k = tl.load(k_cache_ptr + offsets, mask=inside[:, None], other=0)
            v = tl.load(v_cache_ptr + offsets, mask=inside[:, None], other=0)
            live = inside & (tl.load(slot_mask_ptr + row * T + t, mask=inside, other=0) != 0)
            if KV8:  # one scale a (slot, head): on the scores, and folded into the probabilities
                k = _int8_as_fp16(k)
                v = _int8_as_fp16(v)
                s = tl.dot(q16, tl.trans(k)) * (scale * tl.load(k_scale_ptr + cache // D + t, mask=inside, other=0.0))[None, :]
            else:
                s = tl.dot(q16, tl.trans(k)) * scale
            s = tl.where(live[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            if KV8:
                p *= tl.load(v_scale_ptr + cache // D + t, mask=inside, other=0.0)[None, :]
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
            m_i = m_new
        first = r == 0
        acc = tl.sum(tl.where(first[:, None], acc, 0.0), 0)
        m_i = tl.sum(tl.where(first, m_i, 0.0), 0) + tl.zeros((1,), tl.float32)
        l_i = tl.sum(tl.where(first, l_i, 0.0), 0) + tl.zeros((1,), tl.float32)
    else:
        qf = q.to(tl.float32) * scale
        m_i = tl.where(here, s_own, -1e30) + tl.zeros((1,), tl.float32)
        l_i = tl.where(here, 1.0, 0.0) + tl.zeros((1,), tl.float32)
        acc = v_own
        for start in tl.range(lo, hi, BLOCK_T, num_stages=STAGES):
            t = start + tl.arange(0, BLOCK_T)
            inside = t < hi
            offsets = cache + t[:, None] * D + d[None, :]
            k = tl.load(k_cache_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
            v = tl.load(v_cache_ptr + offsets, mask=inside[:, None], other=0.0).to(tl.float32)
            live = inside & (tl.load(slot_mask_ptr + row * T + t, mask=inside, other=0) != 0)
            s = tl.where(live, tl.sum(k * qf[None, :], 1), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            p = tl.exp(s - m_new)
            alpha = tl.exp(m_i - m_new)
            acc = acc * alpha + tl.sum(p[:, None] * v, 0)
            l_i = l_i * alpha + tl.sum(p, 0)
            m_i = m_new
    _finish_attention(acc, m_i, l_i, out_ptr, partial_ptr, arrivals_ptr, row, head, d, H, D, SPLITS, BLOCK_S)


def candidates():
    for splits, warps, block_t, stages in itertools.product((1, 2, 4), (1, 2, 4), (32, 64), (2, 3)):
        yield ("mma", splits, warps, block_t, stages)
        yield ("mma8", splits, warps, block_t, stages)
    for splits, warps, block_t, stages in itertools.product((1, 2, 4), (1, 2), (16, 32), (2, 3)):
        yield ("pipelined", splits, warps, block_t, stages)


def quantized(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 per (slot, head), symmetric: (values, fp32 scales [B, H, T])."""
    scales = cache.float().abs().amax(-1).clamp_min(1e-8) / 127
    return (cache.float() / scales[..., None]).round().clamp(-127, 127).to(torch.int8), scales


def inputs(heads: int, batch: int, copies: int, kv8: bool = False):
    generator = torch.Generator("cuda").manual_seed(0)
    caches = [tuple(torch.randn(batch, heads, LENGTH, D, device="cuda", generator=generator).half() for _ in "kv")
              for _ in range(copies)]
    if kv8:  # (k, v, k scales, v scales)
        caches = [(*(q for q, _ in map(quantized, pair)), *(s for _, s in map(quantized, pair))) for pair in caches]
    q = torch.randn(batch, heads * D, device="cuda", generator=generator).half()
    mask = torch.ones(batch, LENGTH, dtype=torch.bool, device="cuda")
    return caches, q, mask, torch.tensor(SLOT, device="cuda")


def run(job, repeats: int = 0):
    """Launch one walk under one config (compiling it); with repeats, (us a launch, its output)."""
    from pipeline.runtime.kernels.decode_attention import decode_attention
    from pipeline.runtime.kernels.tiles import attention_partials
    heads, batch, cand = job
    size = batch * heads * LENGTH * D * 4
    copies = max(1, -(-200_000_000 // size)) if repeats else 1
    kv8 = cand != "shipped" and cand[0] == "mma8"
    caches, q, mask, slot = inputs(heads, batch, copies, kv8)
    out = torch.empty_like(q)
    arrivals = torch.zeros(batch, heads, dtype=torch.int32, device="cuda")
    if cand == "shipped":
        partial = torch.empty(attention_partials(batch, heads, D), device="cuda")

        def launch(i: int) -> None:
            decode_attention(q, *caches[i % copies], mask, slot, out, partial, arrivals)
    else:
        walk, splits, warps, block_t, stages = cand
        partial = torch.empty(batch, heads, splits, D + 2, device="cuda")
        share = LENGTH // splits

        def launch(i: int) -> None:
            k, v, k_scales, v_scales = caches[i % copies] if kv8 else (*caches[i % copies], None, None)
            _attention_kernel[(batch, heads, splits)](
                q, k, v, k_scales, v_scales, mask, slot, out, partial, arrivals, k.stride(0), k.stride(1), D ** -0.5, T=LENGTH, H=heads,
                D=D, BLOCK_T=min(block_t, share), SHARE=share, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits),
                STAGES=stages, MMA=walk != "pipelined", KV8=kv8, num_warps=warps)
    try:
        launch(0)
        torch.cuda.synchronize()
    except Exception as e:
        return None if repeats else f"{type(e).__name__}: {str(e)[:200]}"
    if not repeats:
        return "ok"
    first = out.float().clone()
    return graph_us(launch, 20, repeats), first


def main() -> None:
    todo = [(h, b, c) for h, b in CASES for c in ["shipped", *candidates()]]
    found = collections.defaultdict(list)
    for job, result in sweep_times(run, todo, repeats=20).items():
        if result is not None:
            found[job[:2]].append((job[2], *result))
    for (heads, batch), rows in found.items():
        shipped = next(r for r in rows if r[0] == "shipped")
        line = f"{heads} heads b{batch}: shipped {shipped[1]:.2f} us"
        for walk in ("mma", "mma8", "pipelined"):
            best = sorted((r for r in rows if r[0] != "shipped" and r[0][0] == walk), key=lambda r: r[1])[:3]
            if best:
                error = ((best[0][2] - shipped[2]).norm() / shipped[2].norm()).item()
                line += f" | {walk} " + "; ".join(f"{us:.2f} {c[1]}/{c[2]}/{c[3]}/{c[4]}" for c, us, _ in best)
                line += f" (error {error:.1e})"
        print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
