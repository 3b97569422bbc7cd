#!/usr/bin/env bash
# After the kernels moved rooms (tiles, step tail, decode attention, products in modules of their
# own): the GPU tests of every kernel compiled for the GPU, then int8_sitting.sh's gpt2 sitting
# (fine-tune, int8-wo export, triton fp16 and int8-wo bench at batch 1 / 8 / 64, validate), so
# the step's speed can be set beside the last recorded figures. Wheels in .whl/; output into $OUT.
# bash docs/journal/probes/house_gpu/check.sh
. "$(dirname "$0")/../shapes_h200/sitting.sh"
step "gpu kernel tests" 300 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/kernels \
  tests/runtime/static/test_cuda_graphs.py
grep -E "passed|failed|error" $L | tail -3
bash "$(dirname "$0")/../int8_weights/int8_sitting.sh" gpt2
