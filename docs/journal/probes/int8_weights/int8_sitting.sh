#!/usr/bin/env bash
# #51 on the GPU once triton reads int8-wo's weights from the exported graph: per preset a 2-step
# fine-tune (random init), the portable int8-wo export (the weights triton reads), triton fp16
# against int8-wo at batch 1 / 8 / 64 in one bench run, and validate of both rows.
# bash docs/journal/probes/int8_weights/int8_sitting.sh [preset ...] (default gpt2 gpt2-xl: the two
# the issue sets targets at; gpt2-xl's export alone takes about 5 minutes); wheels in .whl/; output into $OUT.
. "$(dirname "$0")/../shapes_h200/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
for P in ${@:-gpt2 gpt2-xl}; do
  R="--preset $P --run $P"
  step "finetune $P" 150 $G finetune $R $FT
  step "export $P int8-wo" 420 $G export $R --target portable --precision int8-wo
  step "bench $P" 240 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2
  cp artifacts/$P/reports/bench.json $OUT/bench_$P.json 2>/dev/null
  step "validate $P" 150 $G validate $R --device cuda --backend triton --precision fp16 --precision int8-wo
  cp artifacts/$P/reports/validate.json $OUT/validate_$P.json 2>/dev/null
done
grep -E "^==|rc [1-9]|Error" $L | head -30
