#!/usr/bin/env bash
# Decode attention probes alone (#50): attention_mma.py, or the name and script given.
# bash docs/journal/probes/shapes_h200/attention_sitting.sh [name script]; output into $OUT.
. "$(dirname "$0")/sitting.sh"
cd docs/journal/probes/shapes_h200
step "${1:-attention walks}" 420 python3 ${2:-attention_mma.py}
grep -v "^WARNING" $L | cut -c1-400 | tail -70
