#!/usr/bin/env bash
# gpt2-xl's portable fp16 (ModelOpt AutoCast) and int8 (ModelOpt Q/DQ PTQ) exports on the H200's host
# (#50: its 128 GB hold what the CPU machine's 24 GB cannot), ModelOpt carried as wheels: a 2-step
# fine-tune (random init), the fp32 graph, then the fp16 and int8 graphs side by side, each with
# export's parity check on ONNX Runtime. Output into $OUT. About 11 minutes, past one call's 10: the
# sitting ran the fine-tune and fp32 graph in one call, the two conversions in the next (warm machine).
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
R="--preset gpt2-xl --run xl"
step "finetune xl" 150 $G finetune $R $FT
step "export portable fp32" 150 $G export $R --target portable --precision fp32
# one stage at a time writes a run folder, so the int8 graph goes to a copy of it and the two
# ModelOpt conversions run side by side (not a hard-linked copy: its .lock would be the same file,
# and onnx refuses hard-linked weights)
mkdir artifacts/xl8 && cp -r artifacts/xl/checkpoint artifacts/xl/data artifacts/xl/onnx artifacts/xl/manifest.json artifacts/xl8/
step "export portable int8" 480 $G export --preset gpt2-xl --run xl8 --target portable --precision int8 &
step "export portable fp16" 480 $G export $R --target portable --precision fp16
wait
ls -la artifacts/xl8/onnx/int8 >> $L 2>&1
cp artifacts/xl8/reports/export.json $OUT/export_gpt2-xl_int8.json 2>/dev/null
ls -la artifacts/xl/onnx/* >> $L 2>&1
cp artifacts/xl/reports/export.json $OUT/export_gpt2-xl.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|error|parity|MB|Killed|total|Mem" $L | head -40
