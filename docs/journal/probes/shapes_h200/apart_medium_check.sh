#!/usr/bin/env bash
# gpt2-medium and gpt2-large through the CLI after the norms went apart from 1,024 wide under
# six-stage tiles: 2-step fine-tunes (random init), then the triton bench, fp16 against int8-wo at
# batch 1 / 8 / 64. Each step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
for P in gpt2-medium gpt2-large; do
  R="--preset $P --run $P"
  step "finetune $P" 80 $G finetune $R $FT
  step "bench $P" 90 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
  cp artifacts/$P/reports/bench.json $OUT/bench_$P.json 2>/dev/null
done
grep -E "^==|rc [1-9]|Error|^\| triton" $L | head -30
