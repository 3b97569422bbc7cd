#!/usr/bin/env bash
# gpt2-xl's portable int8 graph (ModelOpt Q/DQ PTQ) on the H200's host (#50), in two calls of one warm
# machine (the run folder stays between them): its first try bounded the fp32 graph at 120 s, too
# short (83.5 s to write, then its parity check), so the int8 export wrote it again and was stopped
# at 331 s. Each part runs a GPU probe beside the export, pinned to cores 0-1 (the export takes the
# other fourteen: its work is on the CPU, ModelOpt calibrating on ONNX Runtime's CPU provider).
#   bash xl_int8.sh fp32   2-step fine-tune (random init), the fp32 graph; beside it int8_h200/left_step.py
#   bash xl_int8.sh int8   the int8 graph with 8 calibration blocks; beside it filled_walk.py
# Output into $OUT: log.txt (the export), the probe's own log, export_gpt2-xl.json. Outcome: the fp32
# graph in 139 s; the int8 one stopped at 540 s, ModelOpt still calibrating after five saves of the
# 6.2 GB graph (performance.md, "gpt2-xl's int8 graph, the second try").
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
R="--preset gpt2-xl --run xl"
HERE=docs/journal/probes
beside() {  # NAME SECONDS CMD...: in the background on cores 0-1, into $OUT/NAME.txt
  (timeout "$2" taskset -c 0,1 "${@:3}" > "$OUT/$1.txt" 2>&1; echo "== rc $?" >> "$OUT/$1.txt") &
}
export OMP_NUM_THREADS=14
if [ "$1" = fp32 ]; then
  step "finetune xl" 120 $G finetune $R $FT
  beside left_step 330 python3 $HERE/int8_h200/left_step.py gpt2-medium gpt2-xl
  step "export portable fp32" 300 taskset -c 2-15 $G export $R --target portable --precision fp32
else
  beside filled_walk 240 python3 $HERE/shapes_h200/filled_walk.py
  TV=$([ -x /usr/bin/time ] && echo "/usr/bin/time -v")  # peak memory, where the host has it
  step "export portable int8" ${2:-540} taskset -c 2-15 $TV $G export $R --target portable --precision int8 \
    --set data.calib_samples=8
  cp artifacts/xl/reports/export.json $OUT/export_gpt2-xl.json 2>/dev/null
fi
wait
ls -la artifacts/xl/onnx/* >> $L 2>&1
grep -E "^==|rc [1-9]|Error|error|parity|MB|Killed|Maximum resident|Elapsed" $L | head -30
grep -hv "^WARNING" $OUT/left_step.txt $OUT/filled_walk.txt 2>/dev/null | cut -c1-600 | tail -30
