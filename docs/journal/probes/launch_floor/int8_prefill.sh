#!/usr/bin/env bash
# int8-wo's prefill on its int8 weights (no float copy of the matrices): the products' GPU test, then
# int8_prefill.py (memory held, prefill time, logits and greedy tokens against fp16; no run folder).
# bash docs/journal/probes/launch_floor/int8_prefill.sh; wheels in .whl/; output into $OUT.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
step "gpu test" 150 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels/test_int8_products_gpu.py
grep -E "passed|failed|error" $L | tail -2
step "int8 prefill" 150 python3 "$(dirname "$0")/int8_prefill.py"
tail -4 $L
