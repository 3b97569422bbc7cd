#!/usr/bin/env bash
# The launch-count test again, then launches and the floor at gpt2-medium (triton fp16, batch 1 / 64).
# bash docs/journal/probes/launch_floor/shapes.sh; wheels in .whl/; output into $OUT.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
step "launch count test" 180 python3 -m pytest -q -x -p no:cacheprovider tests/test_step_cost.py
grep -E "passed|failed|error|assert" $L | tail -3
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "finetune gpt2-medium" 150 $G finetune --preset gpt2-medium --run gpt2-medium $FT
step "bench gpt2-medium" 200 $G bench --preset gpt2-medium --run gpt2-medium --device cuda --backend triton --precision fp16 --batch 1,64 --repeats 2
cp artifacts/gpt2-medium/reports/bench.json $OUT/bench_gpt2-medium.json 2>/dev/null
grep -E "^\| triton|^== " $L | tail -8
