#!/usr/bin/env bash
# Before an int8 KV cache is built (#50, #51): attention alone over one-byte caches, then where
# int8-wo's greedy step goes against fp16's at gpt2-medium and gpt2-xl (step_breakdown.py, no sweep).
# bash docs/journal/probes/shapes_h200/kv8_sitting.sh; output into $OUT.
. "$(dirname "$0")/sitting.sh"
cd docs/journal/probes/shapes_h200
step "kv8 attention" 150 python3 kv8_attention.py
PRECISIONS=fp16,int8-wo SWEEP=0 step "int8 breakdown" 300 python3 step_breakdown.py gpt2-medium gpt2-xl
grep -v "^WARNING" $L | cut -c1-400 | tail -40
