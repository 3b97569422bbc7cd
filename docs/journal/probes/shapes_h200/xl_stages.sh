#!/usr/bin/env bash
# gpt2-xl through export (portable fp32, fp16, int8) and build-engine (TensorRT-RTX plans for sm89)
# on the H200's host (#50), in three calls of one warm machine: its disk wrote the 6.2 GB graph at
# about 145 MB/s (43 s a write), so the run folder lives in /dev/shm while it has the room. The GPU
# is idle meanwhile, so each of the first two parts benches a shape through the CLI beside the
# exports, pinned to cores 0-1 (the exports take the other fourteen).
#   bash xl_stages.sh 1   2-step fine-tune of gpt2-xl (random init), fp32 and fp16 graphs; beside: gpt2-large's bench
#   bash xl_stages.sh 2   the int8 (Q/DQ) graph, default calibration; beside: gpt2-xl's and gpt2-medium's bench
#   bash xl_stages.sh 3   TensorRT-RTX from the wheel parts in .rtx0-2, then the fp16 and int8 plans
# Output into $OUT: log.txt, bench.txt (the benches' log), reports.tgz (the runs' report JSONs).
# Outcome (performance.md, "gpt2-xl's stages in memory"): part 1 made the fp32 graph in 97.9 s (no faster than the 83.5-90.8 s
# on disk: the time is protobuf's, not the disk's) and stopped the fp16 export at its 250 s bound; the
# machine stopped answering during part 2, so part 3 never ran.
. "$(dirname "$0")/sitting.sh"
FT="--set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 --set train.eval_batches=1 --set train.compile=false"
A=/dev/shm/art
[ "$(df -B1G --output=avail /dev/shm | tail -1)" -ge 60 ] || A=$PWD/artifacts
mkdir -p $A
X="--preset gpt2-xl --run xl --artifacts $A"
BENCH="--device cuda --backend triton --precision fp16 --precision int8-wo --batch 1,8,64 --repeats 2"
bench() {  # PRESET...: fine-tune where needed, then bench, each in turn, on cores 0-1
  for P in "$@"; do
    R="--preset $P --run $P --artifacts $A"
    [ -e $A/$P/checkpoint ] || timeout 200 taskset -c 0,1 $G finetune $R $FT >> $OUT/bench.txt 2>&1
    echo "== bench $P" >> $OUT/bench.txt
    timeout 200 taskset -c 0,1 $G bench $R $BENCH >> $OUT/bench.txt 2>&1; echo "== bench $P: rc $?" >> $OUT/bench.txt
  done
}
export OMP_NUM_THREADS=14
echo "artifacts in $A; $(df -h /dev/shm | tail -1)" >> $L
case "$1" in
  1) step "finetune xl" 120 $G finetune $X $FT
     bench gpt2-large &
     step "export portable fp32" 170 taskset -c 2-15 $G export $X --target portable --precision fp32
     step "export portable fp16" 250 taskset -c 2-15 $G export $X --target portable --precision fp16 ;;
  2) bench gpt2-xl gpt2-medium &
     TV=$([ -x /usr/bin/time ] && echo "/usr/bin/time -v")  # peak memory, where the host has it
     step "export portable int8" 560 taskset -c 2-15 $TV $G export $X --target portable --precision int8 ;;
  3) step "tensorrt_rtx" 120 .whl/wheelparts unpack /tmp/site .rtx0 .rtx1 .rtx2
     for p in fp16 int8; do
       step "build $p" 200 $G build-engine $X --precision $p --flavour tensorrt_rtx --target sm89
     done ;;
esac
wait
ls -la $A/xl/onnx/* $A/xl/engines >> $L 2>&1
(cd $A && tar czf $OUT/reports.tgz */reports */engines/*.json 2>/dev/null)
grep -E "^==|rc [1-9]|Error|error|parity|MB|Killed|Maximum resident|Elapsed|artifacts in|plan" $L | cut -c1-300 | head -40
grep -E "^==|Error|^\| triton" $OUT/bench.txt 2>/dev/null | head -30
