# the CPU bench twice on two cores, then twice on every core, on the GPU host with CUDA hidden
set -e
P=.xfer/p4
cat /tmp/parts/part.0 /tmp/parts/part.1 /tmp/parts/part.2 /tmp/parts/part.3 $P/part.4 > /tmp/all.tar
tar -C /tmp -xf /tmp/all.tar && rm /tmp/all.tar
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /tmp/x/*.whl
export PYTHONPATH=/tmp/site:$PWD CUDA_VISIBLE_DEVICES=
mkdir -p artifacts && LD_LIBRARY_PATH=$P/zbin $P/zbin/zstd -dc /tmp/x/timing.tar.zst | tar -C artifacts -xf -
python3 -c "import onnxruntime as o, onnxruntime_genai as g, torch; print(o.__version__, g.__version__, torch.__version__)"
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|MHz"; cat /proc/loadavg; head -1 /proc/stat
run() { # name, taskset cores
  s=$(date +%s); taskset -c $2 python3 $P/g2d.py bench --preset tiny --run timing --artifacts artifacts --batch 1,8 --device cpu > $OUT/$1.log 2>&1 || { tail -5 $OUT/$1.log; exit 1; }
  cp artifacts/timing/reports/bench.json $OUT/$1.json; cp artifacts/timing/reports/bench.md $OUT/$1.md
  echo "$1 $(( $(date +%s) - s )) s; load $(cat /proc/loadavg)"; }
C=$(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(','.join(map(str,c[2:4])), ','.join(map(str,c)))")
TWO=${C% *}; ALL=${C#* }; echo "two cores: $TWO; all: $ALL"
run two1 $TWO; run two2 $TWO
python3 $P/allpairs.py $OUT/two1.json $OUT/two2.json
run all1 $ALL; run all2 $ALL
python3 $P/allpairs.py $OUT/all1.json $OUT/all2.json
head -1 /proc/stat
