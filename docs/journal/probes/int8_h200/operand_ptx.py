"""_fused_linear_kernel compiled for sm90 without a GPU (Triton's own compiler and ptxas), the weights
on either side of the product: what the tensor-core product became (wgmma or mma.sync), how many
shared-memory stores, loads and async copies the PTX holds, and the depths its wgmma waits allow (0:
each product waits for the one before; 1: one stays in flight while the next tile is made ready). Pointers are marked 16-byte aligned, as a
launch marks them; without that no load is vectorised or pipelined.
python docs/journal/probes/int8_h200/operand_ptx.py   (with triton 3.6, the H200 sittings' version)"""

import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pipeline.runtime.kernels import linear_kernels

POINTERS = {"x_ptr": None, "w_ptr": None, "b_ptr": "*fp16", "out_ptr": None, "w_sums_ptr": "*fp32",
            "scale_ptr": "*fp32", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16", "slot_ptr": "*i64",
            "best_ptr": "*fp32", "best_index_ptr": "*i32"}
SCALARS = {"cache_row_stride": "i32", "cache_head_stride": "i32", "M": "i32", "N": "i32", "eps": "fp32"}


def compiled(weights: str, tile: tuple[int, int, int, int], left: bool, ln: bool, residual: bool, k: int = 1280,
             n: int = 3840) -> dict:
    block_m, block_n, block_k, stages = tile
    consts = dict(K=k, C=n, D=64, LN=ln, BIAS=True, GELU=False, RESIDUAL=residual, QKV=False, DOT_PRECISION="tf32",
                  ARGMAX=False, STORE=True, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=1,
                  REF_COLS=64, PDL=True, EARLY=False, SCALED=weights == "int8", INT8_BY_BITS=weights == "int8",
                  W_LEFT=left)
    types = {**POINTERS, **SCALARS, "x_ptr": "*fp32" if ln else "*fp16", "w_ptr": "*i8" if weights == "int8" else "*fp16",
             "out_ptr": "*fp32" if residual else "*fp16"}
    names = linear_kernels._fused_linear_kernel.arg_names
    signature = {name: "constexpr" if name in consts else types[name] for name in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if name in POINTERS}
    kernel = triton.compile(ASTSource(linear_kernels._fused_linear_kernel, signature, consts, attrs=aligned),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=stages))
    ptx = kernel.asm["ptx"]
    return dict(wgmma=ptx.count("wgmma.mma_async"), mma_sync=ptx.count("mma.sync"),
                cp_async=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"), st_shared=ptx.count("st.shared"),
                ld_shared=ptx.count("ld.shared"), shared_bytes=kernel.metadata.shared,
                waits=sorted(set(re.findall(r"wgmma.wait_group.sync.aligned\s+(\d+)", ptx))))


if __name__ == "__main__":
    for weights, tile, left, ln, residual in [
            ("int8", (64, 32, 128, 4), False, False, False), ("int8", (64, 64, 128, 4), True, False, False),
            ("int8", (16, 128, 128, 4), False, True, False), ("int8", (16, 128, 128, 4), True, True, False),
            ("int8", (32, 64, 128, 3), True, False, True), ("fp16", (64, 32, 128, 4), False, False, False),
            ("fp16", (64, 64, 128, 6), True, False, False)]:
        side = "left" if left else "right"
        print(weights, tile, side, "ln" if ln else "", "residual" if residual else "",
              compiled(weights, tile, left, ln, residual), flush=True)
    # gpt2-xl's QKV at 64 rows (x normalised apart): the shipped int8 and fp16 tiles, and int8 in fp16's
    for weights, tile, left in [("int8", (64, 32, 64, 4), False), ("fp16", (64, 64, 128, 6), True),
                                ("int8", (64, 64, 128, 6), True)]:
        print("gpt2-xl QKV", weights, tile, "left" if left else "right",
              compiled(weights, tile, left, False, False, k=1600, n=4800), flush=True)
