"""Shared fixtures: a small real-English corpus and a micro model config, so each test runs the
real pipeline code in seconds on a 2-core CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without a GPU the triton backend's kernels still run, in Triton's interpreter (numpy). Triton
# reads this when it is first imported, which must come after this line.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pipeline.config import load_config
from pipeline.data import embedded_corpus

# A GPT-2 with GPT-2's real vocabulary but one narrow layer: seconds per stage on a CPU.
MICRO = [
    "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "model.n_positions=64",
    "data.block_size=32", "data.calib_samples=4", "data.calib_block_size=16",
    "train.steps=8", "train.batch_size=4", "train.warmup_steps=2", "train.eval_interval=4",
    "train.eval_batches=2", "train.save_interval=4", "train.log_interval=1", "train.num_workers=0",
    "train.device=cpu", "engine.max_batch=4", "engine.max_seq=32", "engine.max_len=64", "engine.opt_len=32",
    "validate.prompts=4", "validate.prompt_tokens=16", "validate.new_tokens=16", "validate.perplexity_blocks=4",
]


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory) -> Path:
    """About 200 KB of the embedded corpus (stdlib docstrings), as a user's text file."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    docs, size = [], 0
    for doc in embedded_corpus():
        docs.append(doc)
        size += len(doc)
        if size > 200_000:
            break
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


@pytest.fixture
def micro_config(corpus_file):
    def make(*extra: str):
        return load_config("tiny", overrides=MICRO + [f"data.source={corpus_file}", *extra])
    return make


@pytest.fixture(scope="session")
def exported_run(tmp_path_factory, corpus_file):
    """A micro model fine-tuned for 20 steps on real text, exported in every precision.
    Shared by the export, validate and engine tests: copy it (copy_run) before changing it."""
    pytest.importorskip("modelopt.onnx.quantization", reason="fp16/int8 export needs the [quant] extra")
    from pipeline.artifacts import RunDir
    from pipeline.export.stage import export
    from pipeline.train.finetune import finetune

    cfg = load_config("tiny", overrides=MICRO + [f"data.source={corpus_file}", "model.n_positions=256", "train.steps=20",
                                                 "train.lr=3e-3"])
    run = RunDir(tmp_path_factory.mktemp("exported") / "run")
    finetune(cfg, run)
    report = export(cfg, run)
    return cfg, run, report


ENGINE_PRECISIONS = ["fp32", "fp16", "int8", "int8-wo"]


@pytest.fixture(scope="session")
def engines(exported_run, tmp_path_factory):
    """A copy of exported_run with a TensorRT-RTX engine (sm86) for every precision."""
    from pipeline.engines.stage import build_engines

    cfg, run, _ = exported_run
    run = copy_run(run, tmp_path_factory.mktemp("engines") / "run")
    return cfg, run, build_engines(cfg, run, ENGINE_PRECISIONS, "tensorrt_rtx", ["sm86"])


def copy_run(run, dest: Path):
    """An independent copy of a run folder, for tests that break or rewrite its artifacts."""
    import shutil

    from pipeline.artifacts import RunDir
    shutil.copytree(run.root, dest)
    return RunDir(dest)


def copy_with_edited_graph(run, dest: Path, precision: str):
    """copy_run, then the copy's portable <precision> graph edited by hand: its sha256 no longer the
    one the manifest recorded."""
    import onnx
    changed = copy_run(run, dest)
    path = changed.onnx(precision) / "model.onnx"
    graph = onnx.load(path)
    graph.doc_string = "edited by hand"
    onnx.save(graph, path)
    return changed
