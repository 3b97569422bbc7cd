#!/usr/bin/env bash
# Attention at 64 rows with no block fetched ahead (#50): its GPU tests, the decode step under the
# shares before it and under attention_config (step_ab.py --attention, random weights, two rounds),
# then, with `cli`, gpt2-medium through the CLI at batch 1 / 8 / 64 and its validate (2-step fine-tune).
# bash docs/journal/probes/shapes_h200/pipelined_sitting.sh [cli]; output into $OUT.
. "$(dirname "$0")/sitting.sh"
if [ "${1:-}" != cli ]; then
step "gpu tests" 120 python3 -m pytest -q -x -p no:cacheprovider tests/runtime/static/test_triton_backend.py \
  tests/runtime/kernels/test_decode_kernels_gpu.py -k "attention or decode_step or greedy_generation"
step "step_ab" 400 python3 docs/journal/probes/shapes_h200/step_ab.py --attention gpt2-medium gpt2-large gpt2-xl
else
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "finetune medium" 90 $G finetune --preset gpt2-medium --run m $FT
step "bench medium" 100 $G bench --preset gpt2-medium --run m --device cuda --backend triton --precision fp16 --batch 1,8,64 --repeats 2
cp artifacts/m/reports/bench.json $OUT/bench_gpt2-medium.json 2>/dev/null
step "validate medium" 70 $G validate --preset gpt2-medium --run m --device cuda --backend triton --precision fp16
cp artifacts/m/reports/validate.json $OUT/validate_gpt2-medium.json 2>/dev/null
fi
grep -E "^==|rc [1-9]|Error|passed|failed|ms a step|tokens/s|rel" $L | cut -c1-300 | head -50
