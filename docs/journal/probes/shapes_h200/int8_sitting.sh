#!/usr/bin/env bash
# int8-wo on the triton engine (#51), first sitting: gpt2 and gpt2-xl, fp16 against int8-wo at batch
# 1 / 8 / 64 in one bench run each, and validate of the int8-wo rows.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
for P in gpt2 gpt2-xl; do
  R="--preset $P --run $P"
  step "finetune $P" 120 $G finetune $R $FT
  step "bench $P" 150 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
  cp artifacts/$P/reports/bench.json $OUT/bench_$P.json 2>/dev/null
  step "validate $P" 60 $G validate $R --device cuda --backend triton --precision int8-wo --precision fp16
  cp artifacts/$P/reports/validate.json $OUT/validate_$P.json 2>/dev/null
done
grep -E "^==|rc [1-9]|Error" $L | head -30
