"""Does `tl.range(..., num_stages=n)` pipeline attention's CUDA-core walk? Compiled for sm90 on the
CPU (Triton's compiler and ptxas, pointers marked 16-byte aligned as a launch marks them): the
"pipelined" walk of attention_mma.py at 1, 2 and 3 stages, its PTX compared line for line (line
information aside), and the shipped kernel's two walks (fetch_ahead True / False) with their
global loads and async copies counted.
PYTHONPATH=. python docs/journal/probes/shapes_h200/attention_ptx.py   (with triton 3.6)"""

import os
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pipeline.runtime.kernels import decode_attention as attention_kernels

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_mma  # noqa: E402  (beside this file)

POINTERS = {"q_ptr": "*fp16", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16", "k_scale_ptr": "*fp32",
            "v_scale_ptr": "*fp32", "slot_mask_ptr": "*i1", "slot_ptr": "*i64", "first_ptr": "*i64",
            "out_ptr": "*fp16", "partial_ptr": "*fp32", "arrivals_ptr": "*i32"}
SCALARS = {"cache_row_stride": "i32", "cache_head_stride": "i32", "scale": "fp32"}


def ptx(kernel, consts: dict) -> str:
    names = kernel.arg_names
    signature = {n: "constexpr" if n in consts else {**POINTERS, **SCALARS}[n] for n in names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if n in POINTERS}
    compiled = triton.compile(ASTSource(kernel, signature, consts, attrs=aligned), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=1, num_stages=3))
    code = compiled.asm["ptx"].split(".section\t.debug")[0]
    return "\n".join(line for line in code.splitlines() if not line.strip().startswith((".loc", ".file")))


def main() -> None:
    shape = dict(T=256, H=16, D=64, BLOCK_T=32, SHARE=256, SPLITS=1, BLOCK_S=1)
    walks = {n: ptx(attention_mma._attention_kernel, {**shape, "STAGES": n, "MMA": False, "KV8": False,
                                                     "k_scale_ptr": None, "v_scale_ptr": None}) for n in (1, 2, 3)}
    print("attention_mma pipelined walk, stages 1 / 2 / 3: PTX",
          "identical" if walks[1] == walks[2] == walks[3] else "differs", f"({len(walks[1].splitlines())} lines)")
    for ahead in (True, False):
        code = ptx(attention_kernels._decode_attention_kernel, {**shape, "FILLED": False, "FETCH_AHEAD": ahead,
                                                              "PDL": True, "EARLY": False})
        print(f"shipped kernel, fetch_ahead {ahead}: {len(code.splitlines())} lines, "
              f"ld.global {code.count('ld.global')}, cp.async {code.count('cp.async')}")


if __name__ == "__main__":
    main()
