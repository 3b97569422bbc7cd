"""Where the ort target's CPU graphs spend their time (#51): the fp32 graph against the int8 one (its
int8 operator as the run's export wrote it), batch 1 and 8 (or the batches given after the run
folder), prompt 128, 64 new tokens, through ort-fused as bench runs it, with ONNX Runtime's profiler
on. Per graph and batch: the timed prefill and its largest operators, ms a token, then each operator
type's share of the decode steps' node time.
`PYTHONPATH=. python docs/journal/probes/cpu_int8/ort_int8_profile.py artifacts/RUN [BATCH ...]` (a run
whose ort target was exported in fp32 and int8)."""
import json
import sys
import time
from collections import Counter
from pathlib import Path

import pipeline.runtime.dynamic.ort_backend as ort_backend
from pipeline.contract import ORT, Contract
from pipeline.machine import cpu_description
from pipeline.runtime.dynamic.ort_fused import OrtFusedBackend
from pipeline.runtime.generate import Generator
from pipeline.runtime.sampling import Sampling

run = Path(sys.argv[1])
batches = [int(b) for b in sys.argv[2:]] or [1, 8]
plain_options = ort_backend.session_options
profiled = []


def profiling_options(*args, **kwargs):
    options = plain_options(*args, **kwargs)
    options.enable_profiling = True
    options.profile_file_prefix = f"/tmp/ort_profile_{len(profiled)}"
    return options


ort_backend.session_options = profiling_options
config = json.loads((run / "onnx-ort" / "fp32" / "genai_config.json").read_text())["model"]
contract = Contract(config["decoder"]["num_hidden_layers"], config["decoder"]["num_attention_heads"],
                    config["decoder"]["head_size"], config["vocab_size"], ORT)
print(cpu_description())  # its torch_kernels: the instruction set this process was given
for precision in ("fp32", "int8"):
    for batch in batches:
        backend = OrtFusedBackend(run / "onnx-ort" / precision / "model.onnx", contract, precision, "cpu")
        generator = Generator(backend)
        prompts = [list(range(100 + row, 228 + row)) for row in range(batch)]
        list(generator.stream(prompts, Sampling(max_new_tokens=4)))  # warm
        start = time.perf_counter()
        steps = len(list(generator.stream(prompts, Sampling(max_new_tokens=64))))
        seconds = time.perf_counter() - start
        trace = json.loads(Path(backend.session.end_profiling()).read_text())
        profiled.append(trace)
        # the warm call's prefill and 3 steps, then the timed call's prefill and 63 steps: decode runs only
        runs = sorted((e for e in trace if e.get("name") == "model_run"), key=lambda e: e["ts"])
        decode = [r for i, r in enumerate(runs) if i not in (0, 4)]
        prefill = Counter()
        for e in trace:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and \
                    runs[4]["ts"] <= e["ts"] <= runs[4]["ts"] + runs[4]["dur"]:
                prefill[e["args"]["op_name"]] += e["dur"]
        print(f"{precision} batch {batch}: prefill {runs[4]['dur'] / 1e3:.1f} ms, by operator: " +
              ", ".join(f"{op} {us / 1e3:.1f} ms" for op, us in prefill.most_common(4)))
        nodes = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and
                 any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in decode)]
        by_op = Counter()
        for e in nodes:
            by_op[e["args"]["op_name"]] += e["dur"]
        total = sum(by_op.values())
        print(f"{precision} batch {batch}: {seconds / steps * 1e3:.2f} ms a token ({batch * steps / seconds:.0f} tokens/s, "
              f"prefill included); decode steps' node time {total / len(decode) / 1e3:.2f} ms a step, by operator:")
        for op, us in by_op.most_common(6):
            print(f"    {op:32s} {us / total:6.1%}  {us / len(decode) / 1e3:6.3f} ms a step")
        del backend, generator
