#!/usr/bin/env bash
# gpt2-xl through every export and its TensorRT-RTX plans on the H200's host (#50), as one chain
# that outlives a call: `start` launches it in a process session of its own (setsid), and each later
# call, made while the machine is still held, carries the next wheel part and waits on it. (xl_stages.sh
# ran the same stages one per call, and its int8 export needs more than one call's ten minutes.)
#   bash xl_chain.sh start      install .whl, copy .rtx0's part, launch the chain on cores 4-15
#   bash xl_chain.sh wait N     copy the carried parts (.rtx1, .rtx2), wait up to N s for the chain
# The chain: a 2-step fine-tune (random init); the portable fp32 graph, then int8 (ModelOpt Q/DQ,
# the default calibration) and its plan once TensorRT-RTX's three parts are in /tmp/parts; the
# portable fp16 graph (AutoCast) and its plan; the ort target's fp32 and int8. Each stage bounded.
# Output into $OUT: chain.txt (its log, with the host's most memory used), reports.tgz.
# First run (performance.md, "gpt2-xl's chain across calls"): the call after `start` found a fresh
# machine (the first had been released in the gap between the calls), so it ran no further than the
# int8 export's start; a chain across calls needs the calls back to back within the machine's idle window.
set -u
C=/tmp/chain
mkdir -p /tmp/parts $C
for f in .rtx0/* .rtx1/* .rtx2/*; do [ -e "$f" ] && [ ! -e /tmp/parts/${f##*/} ] && cp "$f" /tmp/parts/; done
X="--preset gpt2-xl --run xl"
case "$1" in
  start)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.installed || exit 1
    cp .whl/wheelparts $C/
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader > $C/chain.txt
    setsid nohup taskset -c 4-15 bash "$0" chain >> $C/chain.txt 2>&1 < /dev/null &
    echo $! > $C/pid ;;
  chain)
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=12
    G="python3 -m pipeline.cli"
    step() { local s=$(date +%s); echo "== $1"; timeout $2 "${@:3}" 2>&1 | grep -v "it/s\]$" | tail -8
             echo "== $1: rc ${PIPESTATUS[0]} in $(( $(date +%s) - s )) s"; }
    (while sleep 5; do free -m | awk '/^Mem:/ {print $3}'; done > $C/mem.txt) &
    step "finetune xl" 150 $G finetune $X --set train.steps=2 --set train.grad_accum=1 --set train.warmup_steps=0 \
      --set train.eval_batches=1 --set train.compile=false
    step "export portable fp32" 200 $G export $X --target portable --precision fp32
    TV=$([ -x /usr/bin/time ] && echo "/usr/bin/time -v")  # peak memory, where the host has it
    step "export portable int8" 660 $TV $G export $X --target portable --precision int8
    for i in $(seq 120); do [ $(ls /tmp/parts | wc -l) -ge 4 ] && break; sleep 5; done
    step "tensorrt_rtx" 150 $C/wheelparts unpack /tmp/site /tmp/parts
    step "build int8" 300 $G build-engine $X --precision int8 --flavour tensorrt_rtx --target sm89
    step "export portable fp16" 400 $G export $X --target portable --precision fp16
    step "build fp16" 300 $G build-engine $X --precision fp16 --flavour tensorrt_rtx --target sm89
    step "export ort fp32 int8" 300 $G export $X --target ort --precision fp32 --precision int8
    echo "most memory used: $(sort -n $C/mem.txt | tail -1) MB"
    ls -la artifacts/xl/onnx*/* artifacts/xl/engines 2>&1 | grep -v "^total"
    tar czf $C/reports.tgz artifacts/xl/reports artifacts/xl/engines/*.json 2>/dev/null
    touch $C/done ;;
  wait)  # a machine released between calls comes back bare: no chain to wait on, so say so at once
    [ -e $C/chain.txt ] || { echo "no chain on this machine (a fresh one): start it again"; exit 1; }
    for i in $(seq $(( $2 / 5 ))); do  # until it is done, or has died without finishing
      [ -e $C/done ] && break; kill -0 $(cat $C/pid) 2>/dev/null || { echo "the chain ended unfinished"; break; }; sleep 5
    done ;;
esac
[ "$1" = chain ] && exit 0
cp $C/chain.txt $OUT/ 2>/dev/null; cp $C/reports.tgz $OUT/ 2>/dev/null
grep -E "^==|export:|build|Error|Killed|Maximum resident|memory used" $C/chain.txt | cut -c1-250 | tail -30
