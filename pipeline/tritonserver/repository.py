"""`gpt2-deploy package --format triton`: a Triton Inference Server model repository from a run folder.

    <run>/triton/
      <name>/                    the generation model: Triton's Python backend, decoupled
        config.pbtxt             TensorRT-LLM's input names; the backend, precision and row cap as parameters
        1/model.py               pipeline/tritonserver/model.py
        1/run/                   what that backend opens: the checkpoint, its graph or plans, the manifest
        tokenizer/               the checkpoint's tokenizer files
      <name>-onnx-<precision>/   each portable graph export made, on Triton's onnxruntime backend
      <name>-trt-<precision>/    each precision build-engine made plans for, one a compute capability
      README.md                  how to start the server on it

The raw graphs keep their KV cache in Triton (implicit state of the sequence batcher, as Triton's
documentation does for stateful models): a client sends a sequence's tokens and Triton feeds each
step's present back as the next step's past. One sequence an execution (max_batch_size 1): two
sequences' caches differ in length. The repository is written beside its place and put there
whole; it is up to date while the run's artifacts it copies and the options are unchanged."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx

from pipeline.artifacts import RunDir, atomic_dir, fingerprint, graph_files
from pipeline.contract import PORTABLE, Contract, check_graph, graph_io
from pipeline.engines.metadata import EngineMeta, plans_for
from pipeline.errors import UserError
from pipeline.model import require_checkpoint
from pipeline.precisions import PRECISIONS
from pipeline.runtime.loader import BACKENDS, checkpoint_config

STAGE = "package-triton"
TRITON_TYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
# the generation model's optional inputs, as pipeline.tritonserver.model reads them
SETTINGS = (("max_tokens", "TYPE_INT32"), ("temperature", "TYPE_FP32"), ("top_p", "TYPE_FP32"), ("top_k", "TYPE_INT32"),
            ("seed", "TYPE_INT64"), ("repetition_penalty", "TYPE_FP32"), ("presence_penalty", "TYPE_FP32"),
            ("frequency_penalty", "TYPE_FP32"), ("stream", "TYPE_BOOL"), ("ignore_eos", "TYPE_BOOL"))


def package_triton(run: RunDir, backend: str, precision: str, device: str, name: str, max_rows: int,
                   force: bool = False, instances: int = 1, gpus: list[int] | None = None) -> Path:
    """Write <run>/triton (module docstring) unless it is up to date; its path. `instances` model
    instances (each its own engine process) on the CPU, or on each GPU: those of `gpus`, else every one."""
    spec = BACKENDS.get(backend)
    if spec is None:
        raise UserError(f"--backend {backend}: unknown; choose from {', '.join(BACKENDS)}")
    if precision not in spec.precisions:
        raise UserError(f"--backend {backend} runs {'/'.join(spec.precisions)}, not --precision {precision}")
    if device not in spec.devices:
        raise UserError(f"--device {device}: the {backend} backend runs on {'/'.join(spec.devices)}")
    if gpus is not None:
        check_gpus(gpus, device)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise UserError(f"--name {name!r}: letters, digits, '-' and '_' only (a folder of the repository)")
    require_checkpoint(run.checkpoint)
    spec.verify(run, precision)
    graphs = exported_graphs(run)
    runs = [run.checkpoint] + backend_artifacts(run, spec.reads_for(precision), precision)
    target = run.root / "triton"
    # the plans as build-engine recorded them: a plan rebuilt under its old name is a change too
    plans = {plan.name: run.artifact_hashes(f"engine-{plan.stem}") for g in graphs for plan in plans_for(run.engines, g)}
    stamp = fingerprint(backend, precision, device, name, max_rows, instances, gpus, run.artifact_hashes("finetune"),
                        {p: run.require_exported(p) for p in graphs}, plans)
    if not force and target.is_dir() and run.is_fresh(STAGE, stamp):
        print(f"package: {target} is up to date (--force rewrites it)")
        return target
    run.forget(STAGE)
    with atomic_dir(target) as out:
        write_generation_model(out / name, run, runs, backend, precision, instance_group(device, instances, gpus), max_rows)
        contract = Contract.from_hf_config(checkpoint_config(run, None))
        for p in graphs:
            write_graph_model(out, name, run, contract, p, device)
        tokenizer = out / name / "tokenizer"  # in the model's folder: every folder of a repository is a model
        tokenizer.mkdir()
        for file in TOKENIZER_FILES:
            if (run.checkpoint / file).exists():
                shutil.copy2(run.checkpoint / file, tokenizer / file)
        (out / "README.md").write_text(repository_readme(name, graphs, device), encoding="utf-8")
    run.record(STAGE, [target], stamp, {"backend": backend, "precision": precision, "device": device, "name": name,
                                        "max_rows": max_rows, "instances": instances, "gpus": gpus})
    print(f"package: wrote {target} (models: {', '.join(sorted(p.parent.name for p in target.glob('*/config.pbtxt')))})")
    return target


def exported_graphs(run: RunDir) -> list[str]:
    """The precisions with a portable graph in the run, in PRECISIONS' order."""
    return [p for p in PRECISIONS if (run.onnx(p, PORTABLE) / "model.onnx").exists()]


def backend_artifacts(run: RunDir, reads: str, precision: str) -> list[Path]:
    """What a backend reading `reads` opens besides the checkpoint (BackendSpec.reads_for)."""
    if reads == "onnx":
        return [run.onnx(precision)]
    if reads == "onnx-ort":
        return [run.onnx(precision, "ort")]
    if reads == "engine":
        plans = plans_for(run.engines, precision)
        return [run.onnx(precision)] + plans + [p.with_suffix(".json") for p in plans]
    return []


def link_or_copy(source: Path, dest: Path) -> None:
    """A hard link where the file system allows one (a repository beside its run costs no space), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        for f in sorted(source.rglob("*")):
            if f.is_file():
                link_or_copy(f, dest / f.relative_to(source))
        return
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


def check_gpus(gpus: list[int], device: str) -> None:
    """--gpus names GPUs of this host, for a model that runs on one."""
    if device != "cuda":
        raise UserError(f"--gpus {','.join(map(str, gpus))}: the generation model runs on the {device.upper()}; "
                        "--gpus is for --device cuda")
    import torch
    count = torch.cuda.device_count()
    missing = [g for g in gpus if not 0 <= g < count]
    if missing:
        has = f"GPUs 0-{count - 1}" if count > 1 else "GPU 0" if count else "no GPU"
        raise UserError(f"--gpus: this host has no GPU {missing[0]} (it has {has})")


def instance_group(device: str, instances: int, gpus: list[int] | None) -> str:
    """`instances` model instances on the CPU, or on each GPU (those of `gpus`, else Triton's every one)."""
    where = f" gpus: [ {', '.join(map(str, gpus))} ]" if gpus else ""
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    return f"instance_group [ {{ count: {instances} kind: {kind}{where} }} ]"


def write_generation_model(folder: Path, run: RunDir, runs: list[Path], backend: str, precision: str, instances: str,
                           max_rows: int) -> None:
    version = folder / "1"
    for path in runs:
        link_or_copy(path, version / "run" / run.rel(path))
    shutil.copy2(run.manifest_path, version / "run" / "manifest.json")
    shutil.copy2(Path(__file__).with_name("model.py"), version / "model.py")
    inputs = [_tensor("text_input", "TYPE_STRING", [1])] + [_tensor(n, t, [1], optional=True) for n, t in SETTINGS]
    inputs.append(_tensor("stop", "TYPE_STRING", [-1], optional=True))
    outputs = [_tensor("text_output", "TYPE_STRING", [1]), _tensor("output_ids", "TYPE_INT32", [-1]),
               _tensor("finish_reason", "TYPE_STRING", [1])]
    parameters = "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}'
                           for k, v in (("backend", backend), ("precision", precision), ("max_rows", max_rows)))
    (folder / "config.pbtxt").write_text(
        f'name: "{folder.name}"\nbackend: "python"\n'
        "# batching happens inside the instance (the project's continuous batching): Triton hands requests on as they come\n"
        "max_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n"
        f"input [\n{_list(inputs)}\n]\noutput [\n{_list(outputs)}\n]\n{instances}\n{parameters}\n", encoding="utf-8")


def write_graph_model(out: Path, name: str, run: RunDir, contract: Contract, precision: str, device: str) -> None:
    """The portable graph of `precision` on the onnxruntime backend, and its plans, if any, on TensorRT's."""
    graph = run.onnx(precision) / "model.onnx"
    model = onnx.load(graph, load_external_data=False)
    check_graph(model, contract, str(graph))
    io = graph_io(model)
    onnx_folder = out / f"{name}-onnx-{precision}"
    for f in graph_files(graph):
        if f.exists():
            link_or_copy(f, onnx_folder / "1" / f.name)
    (onnx_folder / "config.pbtxt").write_text(
        graph_config(onnx_folder.name, 'platform: "onnxruntime_onnx"', contract, io, device), encoding="utf-8")
    plans = plans_for(run.engines, precision)
    if plans:
        trt_folder = out / f"{name}-trt-{precision}"
        files = []
        for plan in plans:
            link_or_copy(plan, trt_folder / "1" / plan.name)
            files += [(t, plan.name) for t in EngineMeta.read(plan.with_suffix(".json")).targets]
        capability = "\n".join(f'  {{ key: "{t[2:-1]}.{t[-1]}" value: "{f}" }}' for t, f in files)
        (trt_folder / "config.pbtxt").write_text(
            graph_config(trt_folder.name, f'platform: "tensorrt_plan"\ncc_model_filenames [\n{capability}\n]', contract,
                         io, "cuda"), encoding="utf-8")


def graph_config(name: str, platform: str, contract: Contract, io: dict, device: str) -> str:
    """A raw graph's config: the token inputs and logits as tensors of one sequence, the cache as
    implicit state (module docstring). The batch axis is Triton's (max_batch_size 1)."""
    tokens = [_tensor(n, TRITON_TYPES[io[n][0]], [-1]) for n in ("input_ids", "attention_mask", "position_ids")]
    logits = _tensor("logits", TRITON_TYPES[io["logits"][0]], [-1, contract.vocab_size])
    kv = TRITON_TYPES[io[contract.past_names[0]][0]]
    shape = f"{contract.n_head}, -1, {contract.head_dim}"
    states = [f'    {{ input_name: "{past}" output_name: "{present}" data_type: {kv} dims: [ {shape} ]\n'
              f'      initial_state {{ name: "empty" data_type: {kv} dims: [ {contract.n_head}, 0, {contract.head_dim} ] '
              "zero_data: true } }"
              for past, present in zip(contract.past_names, contract.present_names)]
    return (f'name: "{name}"\n{platform}\nmax_batch_size: 1\ninput [\n{_list(tokens)}\n]\noutput [\n{logits}\n]\n'
            "sequence_batching {\n  max_sequence_idle_microseconds: 60000000\n  state [\n" + ",\n".join(states) +
            f"\n  ]\n}}\n{instance_group(device, 1, None)}\n")


def repository_readme(name: str, graphs: list[str], device: str) -> str:
    raw = ", ".join(f"`{name}-onnx-{p}`" for p in graphs) or "none (no portable graph was exported)"
    return f"""# Triton Inference Server model repository (gpt2-deploy)

- `{name}`: text generation on Triton's Python backend, this project's runtime inside it, with
  continuous batching across requests. `POST /v2/models/{name}/generate` with
  `{{"text_input": "...", "max_tokens": 32}}` and optional `temperature` (0: greedy), `top_p`, `top_k`,
  `seed`, `stop`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`; `generate_stream`
  with `"stream": true` streams a response a step.
- Raw graphs, the KV cache held by Triton as implicit state: {raw}; `{name}-trt-*` where TensorRT
  plans were built.
- `{name}/tokenizer/`: the model's tokenizer files.

## Start the server

The Python backend's environment needs gpt2-deploy installed and numpy < 2 (the backend's stub is
built against numpy 1). With the `tritonserver` that the `nvidia-pytriton` wheel carries, on a
machine without a container (`make triton-env` in gpt2-deploy's checkout prepares `.venv-triton`):

    .venv-triton/bin/gpt2-deploy-tritonserver --model-repository $PWD

With NVIDIA's container (the raw graphs need its onnxruntime and TensorRT backends):

    docker run --gpus all --rm -p 8000:8000 -v $PWD:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 \\
      tritonserver --model-repository /models

The generation model runs on the {'GPU' if device == 'cuda' else 'CPU'}.
"""


def _tensor(name: str, dtype: str, dims: list[int], optional: bool = False) -> str:
    return (f'  {{ name: "{name}" data_type: {dtype} dims: [ {", ".join(map(str, dims))} ]'
            f'{" optional: true" if optional else ""} }}')


def _list(items: list[str]) -> str:
    return ",\n".join(items)
