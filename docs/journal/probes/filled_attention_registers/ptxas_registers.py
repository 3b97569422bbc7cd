"""Registers and spills of the decode attention kernel as ptxas builds it for an H200 (sm_90a),
compiled here without a GPU: Triton's compiler for a named target, the launch's specialisation
(every pointer and stride divisible by 16) given by hand. Fixed against FILLED shares, capped
(`maxnreg`, what attention_config asks at 64 rows) and not, and the compile-time-share variant of
attention_filled_variants.py (measured 9.15 us against 11.14 for FILLED as shipped). Triton as the
GPU machine has it, from the repository root:
`pip install --target /tmp/triton36 --no-deps triton==3.6.0`, then
`PYTHONPATH=/tmp/triton36:. python docs/journal/probes/filled_attention_registers/ptxas_registers.py`"""
import pathlib
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "serve_h200_row_first_slot"))
from attention_filled_variants import patched_kernels  # noqa: E402

from pipeline.runtime.kernels.decode_attention import _decode_attention_kernel  # noqa: E402

SIGNATURE = {"q_ptr": "*fp16", "k_cache_ptr": "*fp16", "v_cache_ptr": "*fp16", "slot_mask_ptr": "*i1",
             "slot_ptr": "*i64", "first_ptr": "*i64", "out_ptr": "*fp16", "partial_ptr": "*fp32",
             "arrivals_ptr": "*i32", "cache_row_stride": "i32", "cache_head_stride": "i32", "scale": "fp32"}
PTXAS = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
H, D, LENGTH = 12, 64, 2048  # GPT-2 124M's heads over the serving scheduler's cache


def ptxas_report(kernel, filled: bool, splits: int, warps: int, block_t: int, cap: int | None) -> str:
    share = triton.cdiv(LENGTH, splits)
    constants = {"T": LENGTH, "H": H, "D": D, "BLOCK_T": min(block_t, triton.next_power_of_2(share)), "SHARE": share,
                 "SPLITS": splits, "BLOCK_S": triton.next_power_of_2(splits), "FILLED": filled, "PDL": True, "EARLY": False}
    names = list(SIGNATURE) + list(constants)
    source = ASTSource(fn=kernel, signature={**SIGNATURE, **dict.fromkeys(constants, "constexpr")},
                       constexprs={(names.index(k),): v for k, v in constants.items()},
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(len(SIGNATURE) - 1)})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, "launch_pdl": True, **({"maxnreg": cap} if cap else {})})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        report = subprocess.run([str(PTXAS), "-arch=sm_90a", "-v", ptx.name, "-o", "/dev/null"],
                                capture_output=True, text=True).stderr
    registers = re.search(r"Used (\d+) registers", report).group(1)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report).groups()
    return f"{registers} registers, spill stores / loads {spills[0]} / {spills[1]} bytes"


def main():
    share_const = patched_kernels().kernel_share_const
    print(f"Triton {triton.__version__}, sm_90a, {LENGTH}-slot cache")
    for rows, (splits, warps, block_t) in ((64, (4, 1, 16)), (8, (1, 8, 256)), (1, (8, 2, 32))):
        caps = (80, None) if rows == 64 else (None,)
        for name, kernel, filled in (("fixed", _decode_attention_kernel, False), ("FILLED", _decode_attention_kernel, True),
                                     ("FILLED, compile-time share", share_const, True)):
            for cap in caps:
                print(f"rows {rows:2d} ({splits} splits, {warps} warps, block {block_t}) {name}, cap {cap or 'none'}: "
                      f"{ptxas_report(kernel, filled, splits, warps, block_t, cap)}", flush=True)
    for cap in (72, 76, 84, 88, 96):
        print(f"rows 64 FILLED, cap {cap}: {ptxas_report(_decode_attention_kernel, True, 4, 1, 16, cap)}", flush=True)


if __name__ == "__main__":
    main()
