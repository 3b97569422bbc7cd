#!/usr/bin/env bash
# A tile sweep at 64 rows and the whole step under its choices, in one sitting on one H200:
# `bash tiles_sitting.sh PROBE` with PROBE weights_left or deep_tiles (this folder):
# PROBE sweep -> $OUT/chosen.json, then PROBE step on it for every shape. Output into $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
L=$OUT/log.txt
step() { local s=$(date +%s); echo "== $1" >> $L; timeout $2 "${@:3}" >> $L 2>&1; echo "== $1: rc $? in $(( $(date +%s) - s )) s" >> $L; }
P=docs/journal/probes/int8_h200/$1.py
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >> $L
step "sweep" 200 python3 $P sweep $OUT
step "step" 330 python3 $P step $OUT/chosen.json gpt2 gpt2-medium gpt2-large gpt2-xl
grep -E "^==|passed|failed|Error|width|gpt2" $L | grep -v "^tests/" | head -150
