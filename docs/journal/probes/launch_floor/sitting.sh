#!/usr/bin/env bash
# The decode step against its memory floor (bench's launches/step, read GB/s and of-floor columns):
# the test that the profiler counts the kernels inside CUDA graphs, then int8_sitting.sh's gpt2
# sitting (fine-tune, int8-wo export, triton fp16 and int8-wo bench at batch 1 / 8 / 64, validate).
# bash docs/journal/probes/launch_floor/sitting.sh; wheels in .whl/; output into $OUT.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
step "launch count test" 180 python3 -m pytest -q -x -p no:cacheprovider tests/test_step_cost.py
grep -E "passed|failed|error" $L | tail -2
bash "$(dirname "$0")/../int8_weights/int8_sitting.sh" gpt2
python3 "$(dirname "$0")/../int8_weights/summarise.py" $OUT | tee -a $L
