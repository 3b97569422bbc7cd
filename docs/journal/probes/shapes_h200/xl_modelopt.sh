#!/usr/bin/env bash
# gpt2-xl's portable fp16 (ModelOpt AutoCast) and int8 (ModelOpt Q/DQ PTQ) exports on the H200's host
# (#50: its 128 GB hold what the CPU machine's 24 GB cannot), ModelOpt carried as wheels. Part 1: a
# 2-step fine-tune (random init) and the fp16 graph (the fp32 one first); part 2, on the same warm
# machine: the int8 graph. Each export runs its parity check on ONNX Runtime. Output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
R="--preset gpt2-xl --run xl"
if [ "$1" = 1 ]; then
  step "finetune xl" 150 $G finetune $R $FT
  step "export portable fp16" 420 $G export $R --target portable --precision fp16
else
  step "export portable int8" 560 $G export $R --target portable --precision int8
fi
ls -la artifacts/xl/onnx/* >> $L 2>&1
cp artifacts/xl/reports/export.json $OUT/export_gpt2-xl_$1.json 2>/dev/null
free -g | head -2 >> $L
grep -E "^==|rc [1-9]|Error|error|parity|MB|Killed|total|Mem" $L | head -40
