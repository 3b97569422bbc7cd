#!/usr/bin/env bash
# gpt2-xl through export (portable fp32, fp16, int8) and build-engine (TensorRT-RTX plans for sm89)
# on the H200's host (#50), in three calls of one warm machine (the run folder stays between them).
#   bash xl_stages.sh 1   2-step fine-tune of gpt2-xl (random init), fp32 and fp16 graphs; beside them,
#                         on cores 0-1 (the exports take the other fourteen), gpt2-large's bench
#   bash xl_stages.sh 2   the int8 (Q/DQ) graph, default calibration, alone
#   bash xl_stages.sh 3   TensorRT-RTX from the wheel parts in .rtx0-2, then the fp16 and int8 plans
# Each call carries one part: .whl and .rtx0 with part 1, .rtx1 with 2, .rtx2 with 3.
# Output into $OUT: log.txt, bench.txt (the bench's log), mem.txt (the host's used memory every 5 s),
# reports.tgz (the runs' report JSONs).
# Outcome of its first form (performance.md, "gpt2-xl's stages in memory"), which kept the run folder
# in /dev/shm and benched gpt2-xl and gpt2-medium beside the int8 export: part 1 made the fp32 graph in
# 97.9 s (no faster than the 83.5-90.8 s on disk) and stopped the fp16 export at its 250 s bound (before
# AutoCast's own type inference); the machine stopped answering during part 2, cause unseen (the host's
# memory is the suspect: the folder in memory, three processes and ModelOpt at gpt2-xl), so part 3
# never ran. This form keeps the run folder on disk, runs the int8 export alone and samples memory.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
X="--preset gpt2-xl --run xl"
(while sleep 5; do free -m | awk '/^Mem:/ {print $3}'; done >> $OUT/mem.txt) &
SAMPLER=$!
export OMP_NUM_THREADS=14
case "$1" in
  1) step "finetune xl" 120 $G finetune $X $FT
     (R="--preset gpt2-large --run gpt2-large"
      taskset -c 0,1 $G finetune $R $FT > $OUT/bench.txt 2>&1
      taskset -c 0,1 $G bench $R --device cuda --backend triton --precision fp16 --precision int8-wo \
        --batch 1,8,64 --repeats 2 >> $OUT/bench.txt 2>&1; echo "== bench: rc $?" >> $OUT/bench.txt) &
     step "export portable fp32" 170 taskset -c 2-15 $G export $X --target portable --precision fp32
     step "export portable fp16" 280 taskset -c 2-15 $G export $X --target portable --precision fp16 ;;
  2) TV=$([ -x /usr/bin/time ] && echo "/usr/bin/time -v")  # peak memory, where the host has it
     step "export portable int8" 570 $TV $G export $X --target portable --precision int8 ;;
  3) step "tensorrt_rtx" 120 .whl/wheelparts unpack /tmp/site .rtx0 .rtx1 .rtx2
     for p in fp16 int8; do
       step "build $p" 200 $G build-engine $X --precision $p --flavour tensorrt_rtx --target sm89
     done ;;
esac
kill $SAMPLER; wait
echo "most memory used: $(sort -n $OUT/mem.txt | tail -1) MB" >> $L
ls -la artifacts/xl/onnx/* artifacts/xl/engines >> $L 2>&1
tar czf $OUT/reports.tgz artifacts/*/reports artifacts/*/engines/*.json 2>/dev/null
grep -E "^==|rc [1-9]|Error|error|parity|MB|Killed|Maximum resident|Elapsed|plan" $L | cut -c1-300 | head -40
grep -E "^==|Error|^\| triton" $OUT/bench.txt 2>/dev/null | head -20
