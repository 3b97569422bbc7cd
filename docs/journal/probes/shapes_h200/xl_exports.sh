#!/usr/bin/env bash
# gpt2-xl's exports that need no ModelOpt, on the H200's host (#50): a 2-step fine-tune (random init),
# then the ort target in fp32 and the portable graph in int8-wo (both past protobuf's 2 GB: external
# data), each with export's parity check on ONNX Runtime. Each step bounded, output into $OUT.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
R="--preset gpt2-xl --run xl"
step "finetune xl" 100 $G finetune $R $FT
step "export ort fp32" 150 $G export $R --target ort --precision fp32
step "export portable int8-wo" 300 $G export $R --target portable --precision int8-wo
ls -la artifacts/xl/onnx-ort/fp32 artifacts/xl/onnx/int8-wo >> $L 2>&1
cp artifacts/xl/reports/export.json $OUT/export_gpt2-xl.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|error|parity|MB|total" $L | head -40
