#!/usr/bin/env bash
# After the layer norms went apart (#50, #51): int8-wo validated on the H200 at gpt2-medium and
# gpt2-large (the two shapes it had not been), and gpt2-large benched through the CLI, fp16 against
# int8-wo at batch 1 / 8 / 64, from 2-step fine-tunes (random init). Each step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
step "finetune medium" 90 $G finetune --preset gpt2-medium --run m $FT
step "validate medium" 70 $G validate --preset gpt2-medium --run m --device cuda --backend triton --precision int8-wo
cp artifacts/m/reports/validate.json $OUT/validate_gpt2-medium.json 2>/dev/null
step "finetune large" 110 $G finetune --preset gpt2-large --run l $FT
step "validate large" 70 $G validate --preset gpt2-large --run l --device cuda --backend triton --precision int8-wo
cp artifacts/l/reports/validate.json $OUT/validate_gpt2-large.json 2>/dev/null
step "bench large" 130 $G bench --preset gpt2-large --run l --device cuda --backend triton --precision fp16 --precision int8-wo \
  --batch 1,8,64 --repeats 2
cp artifacts/l/reports/bench.json $OUT/bench_gpt2-large.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|rel|PASS|FAIL|pass|fail" $L | head -40
