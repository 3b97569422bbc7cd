# The CPU's ort graphs served (#51): `serve --device cpu --backend ort-fused` of fp32, then int8, each
# measured by `loadtest` at 1 and 2 streaming clients, greedy then sampled (temperature 0.8, top_p
# 0.95), prompt ~128 tokens, 64 new tokens. Server and clients share the machine's cores.
# From the repository root: bash docs/journal/probes/cpu_int8/served_cpu.sh RUN OUT
set -u
run=$1 out=$2
G=.venv/bin/gpt2-deploy
for p in fp32 int8; do
  $G serve --preset gpt2 --run "$run" --device cpu --backend ort-fused --precision $p --port 8077 > "$out/serve_$p.log" 2>&1 &
  pid=$!
  for _ in $(seq 120); do curl -sf localhost:8077/ready >/dev/null && break; sleep 1; done
  $G loadtest http://127.0.0.1:8077 --concurrency 1,2 --prompt-tokens 128 --max-tokens 64 --duration 20 --warmup 3 \
    --out "$out/${p}_greedy"
  $G loadtest http://127.0.0.1:8077 --concurrency 1,2 --prompt-tokens 128 --max-tokens 64 --duration 20 --warmup 3 \
    --temperature 0.8 --top-p 0.95 --out "$out/${p}_sampled"
  kill -TERM $pid; wait $pid
done
