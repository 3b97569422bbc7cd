#!/usr/bin/env bash
# gpt2-xl through the CLI after the layer norms went apart: a 2-step fine-tune (random init), then
# the triton bench, fp16 against int8-wo at batch 1 / 8 / 64. Each step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "finetune xl" 100 $G finetune --preset gpt2-xl --run xl $FT
step "bench xl" 90 $G bench --preset gpt2-xl --run xl --device cuda --backend triton --precision fp16 --precision int8-wo \
  --batch 1,8,64 --repeats 2
cp artifacts/xl/reports/bench.json $OUT/bench_gpt2-xl.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|^\| triton" $L | head -20
