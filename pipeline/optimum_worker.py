"""Optimum's side of `python -m pipeline.optimum_compare`, run by the Python of an environment of its
own (`make optimum-env`: Optimum's ONNX exporter needs transformers 4.x, this project runs on 5.x),
so it imports nothing of this project.

Optimum's best on the CPU, as its documentation gives it: ORTModelForCausalLM on its own export of
the checkpoint (fp32, with the KV cache), and that export quantised by its ORTQuantizer with the
dynamic int8 configuration for this processor (dynamic_config: avx512_vnni, avx512 or avx2).
It exports and quantises once into WORKDIR, warms each model up at every batch, prints `ready` and a
JSON line of what it runs, then times one greedy generation of each model at each batch for every
`round` line on stdin (printing a JSON line of tokens/s), until `quit`.

    python pipeline/optimum_worker.py CHECKPOINT WORKDIR PROMPTS.npy NEW_TOKENS BATCH[,BATCH...]"""

import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch
import transformers
from optimum.onnxruntime import ORTModelForCausalLM, ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig


def dynamic_config() -> str:
    """Optimum's dynamic int8 configuration for the instruction set this process is given (CPUID, as
    torch reads it: a hypervisor can give less than /proc/cpuinfo lists), VNNI from the flags."""
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        return "avx2"
    try:
        return "avx512_vnni" if "avx512_vnni" in Path("/proc/cpuinfo").read_text() else "avx512"
    except OSError:
        return "avx512"


def models(checkpoint: str, workdir: Path) -> dict:
    """fp32 (Optimum's export) and int8 (its dynamic quantisation of that export), made once in workdir."""
    fp32_dir = workdir / "fp32"
    if not (fp32_dir / "model.onnx").exists():
        ORTModelForCausalLM.from_pretrained(checkpoint, export=True, use_cache=True).save_pretrained(fp32_dir)
    kind = dynamic_config()
    config = getattr(AutoQuantizationConfig, kind)(is_static=False, per_channel=False)
    int8_dir = workdir / f"int8-{kind}"
    if not (int8_dir / "model_quantized.onnx").exists():
        ORTQuantizer.from_pretrained(fp32_dir).quantize(save_dir=int8_dir, quantization_config=config)
    return {"optimum fp32": ORTModelForCausalLM.from_pretrained(fp32_dir, use_cache=True),
            f"optimum int8 ({kind})":
                ORTModelForCausalLM.from_pretrained(int8_dir, file_name="model_quantized.onnx", use_cache=True)}


def seconds(model, ids: torch.Tensor, new_tokens: int) -> float:
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   do_sample=False, pad_token_id=0)
    return time.perf_counter() - start


def main() -> None:
    checkpoint, workdir, prompts, new_tokens, batches = sys.argv[1:6]
    workdir, new_tokens = Path(workdir), int(new_tokens)
    ids = torch.from_numpy(np.load(prompts))
    batches = [int(b) for b in batches.split(",")]
    runs = models(checkpoint, workdir)
    for model in runs.values():
        for batch in batches:
            seconds(model, ids[:batch], new_tokens)
    print("ready", flush=True)
    print(json.dumps({"models": list(runs), "transformers": transformers.__version__,
                      "onnxruntime": onnxruntime.__version__, "torch": torch.__version__}), flush=True)
    for line in sys.stdin:
        if line.strip() == "quit":
            break
        rates = {name: {str(b): b * new_tokens / seconds(model, ids[:b], new_tokens) for b in batches}
                 for name, model in runs.items()}
        print(json.dumps(rates), flush=True)


if __name__ == "__main__":
    main()
