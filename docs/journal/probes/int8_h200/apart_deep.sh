#!/usr/bin/env bash
# apart_deep.py on one H200 (#50): gpt2-medium's 64-row QKV and fc products with the norms apart
# under deep K tiles, alone and in the step. Output into $OUT.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader > $OUT/log.txt
timeout 400 python3 docs/journal/probes/int8_h200/apart_deep.py >> $OUT/log.txt 2>&1; echo "rc $?" >> $OUT/log.txt
grep -E "width|gpt2|rc |Error" $OUT/log.txt
