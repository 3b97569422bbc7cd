#!/usr/bin/env bash
# One portable export with its memory over time (the tenth section of performance.md): the run folder
# ARTIFACTS/RUN (checkpoint and fp32 graph made) is copied to a fresh one, PRECISION is exported there
# by the tree in TREE (default: this checkout), and every 2 s a line gives the seconds, the process
# tree's anonymous and file-backed resident memory (GB), the machine's available memory (GB) and what
# the export's temporary folder holds. The copy is removed at the end.
#   [PRESET=gpt2-large] bash docs/journal/probes/cpu_memory/export_memory_trace.sh ARTIFACTS RUN PRECISION [TREE]
set -u
ARTIFACTS=$(realpath "$1") RUN=$2 PREC=$3 TREE=$(realpath "${4:-.}")
PY=${PYTHON:-$PWD/.venv/bin/python}  # not resolved: the link is what makes it the environment's
COPY=trace_$RUN
rm -rf "$ARTIFACTS/$COPY" && cp -r "$ARTIFACTS/$RUN" "$ARTIFACTS/$COPY"
(cd "$TREE" && exec "$PY" -m pipeline.cli export --preset "${PRESET:-gpt2-large}" --run "$COPY" --artifacts "$ARTIFACTS" \
   --target portable --precision "$PREC" > "$ARTIFACTS/$COPY.out" 2>&1) &
PID=$! START=$(date +%s)
gb() { echo "scale=1; $1 / 1048576" | bc; }
while kill -0 $PID 2>/dev/null; do
  anon=0 file=0
  for p in $PID $(pgrep -P $PID) $(pgrep -P "$(pgrep -P $PID | tr '\n' ',' | sed 's/,$//')" 2>/dev/null); do
    read -r a f < <(awk '/RssAnon/ {a=$2} /RssFile/ {f=$2} END {print a+0, f+0}' /proc/$p/status 2>/dev/null) || continue
    anon=$((anon + a)) file=$((file + f))
  done
  avail=$(awk '/MemAvailable/ {print $2}' /proc/meminfo)
  echo "$(( $(date +%s) - START )) anon $(gb $anon) file $(gb $file) avail $(gb $avail)" \
       "tmp $(ls "$ARTIFACTS/$COPY"/onnx/.*tmp/ 2>/dev/null | tr '\n' ' ' | cut -c1-120)"
  sleep 2
done
wait $PID; echo "rc $?"
grep -E "export: onnx|rror" "$ARTIFACTS/$COPY.out" || tail -3 "$ARTIFACTS/$COPY.out"
rm -rf "$ARTIFACTS/$COPY" "$ARTIFACTS/$COPY.out"
