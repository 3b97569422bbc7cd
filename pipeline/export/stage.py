"""`gpt2-deploy export`: checkpoint -> onnx/{fp32,fp16,int8,int8-wo}/model.onnx (the portable
target) and onnx-ort/<precision>/ (the ort target: model.onnx, genai_config.json, tokenizer files).

Portable fp32 comes from PyTorch, fp16 and int8 are transforms of the fp32 graph, and int8-wo comes
from PyTorch too, from the model with its layer norms folded (export/int8.py). The ort
target's graphs are written from the weights (export/ort_graph.py). Each variant is written into a
temporary folder, checked (ONNX checker, shape inference, the contract, and a parity run on ONNX
Runtime against PyTorch) and only then moved into place, so a failed or interrupted export leaves
nothing a later stage could mistake for a good graph."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.accuracy import graph_parity, torch_reference
from pipeline.artifacts import (
    RunDir,
    atomic_dir,
    atomic_write_json,
    export_stage,
    fingerprint,
)
from pipeline.config import Config
from pipeline.contract import ORT, PORTABLE, Contract, check_graph
from pipeline.data import heldout_blocks, prepare_data
from pipeline.errors import UserError
from pipeline.export.calibration import calibration_feeds
from pipeline.export.fp16 import convert_fp16
from pipeline.export.genai_config import write_genai_folder
from pipeline.export.graph_file import finish_graph
from pipeline.export.int8 import convert_int8_qdq, export_int8_weight_only
from pipeline.export.onnx_fp32 import export_fp32
from pipeline.export.ort_graph import GRAPH_VERSION, ORT_GRAPHS, export_ort_graph
from pipeline.machine import gpt2_parameters
from pipeline.model import load_checkpoint
from pipeline.precisions import PRECISIONS
from pipeline.progress import console, progress
from pipeline.tokenizer import load_tokenizer

MODEL_FILE = "model.onnx"
GPT2_124M = gpt2_parameters(layers=12, hidden=768, vocab=50257, positions=1024)


def autocast_samples(parameters: int) -> int:
    """Calibration samples for fp16 AutoCast, which keeps every intermediate tensor of its reference
    run in memory: 8 up to GPT-2 124M (64 of it do not fit in 24 GB), fewer as the model grows
    (gpt2-medium 2: 18 GB at its peak, where 8 were killed on a 24 GB machine; docs/journal/performance.md)."""
    return max(1, min(8, 8 * GPT2_124M // parameters))


def _export_fp32(fp32_path: Path, out: Path, model, calib: np.ndarray, opset: int) -> None:
    export_fp32(model, out, opset)


def _autocast_fp16(fp32_path: Path, out: Path, model, calib: np.ndarray, opset: int) -> None:
    npz = out.with_name("calibration.npz")
    # a few samples show the value ranges AutoCast needs
    np.savez(npz, **calibration_feeds(model, calib[:autocast_samples(model.num_parameters())]))
    convert_fp16(fp32_path, out, npz)
    npz.unlink()


def _quantize_int8(fp32_path: Path, out: Path, model, calib: np.ndarray, opset: int) -> None:
    convert_int8_qdq(fp32_path, out, calibration_feeds(model, calib))


def _weight_only_int8(fp32_path: Path, out: Path, model, calib: np.ndarray, opset: int) -> None:
    export_int8_weight_only(model, out, opset)


# how each precision of precisions.PRECISIONS is made: (fp32 graph, output path, model, calibration blocks, opset)
CONVERTERS = {"fp32": _export_fp32, "fp16": _autocast_fp16, "int8": _quantize_int8, "int8-wo": _weight_only_int8}
# the precisions made from the fp32 graph: its hash is part of their fingerprint
FROM_FP32_GRAPH = ("fp16", "int8")


@dataclass(frozen=True)
class Variant:
    """How export makes one target's precision: what it depends on besides the checkpoint and the
    opset (its fingerprint), how it writes the graph, and what export.json calls it."""
    depends_on: tuple
    write: Callable[[Path], None]
    key: str
    graph: str


def _portable(run: RunDir, cfg: Config, precision: str, model, calib: np.ndarray) -> Variant:
    d, fp32 = cfg.data, run.onnx("fp32") / MODEL_FILE
    fp32_hash = run.artifact_hashes("export-fp32").get(f"onnx/fp32/{MODEL_FILE}") if precision in FROM_FP32_GRAPH else None
    calibration = (d.calib_samples, d.calib_block_size, run.artifact_hashes("data")) if PRECISIONS[precision].calibrated else None
    return Variant((fp32_hash, calibration), lambda out: CONVERTERS[precision](fp32, out, model, calib, cfg.export.opset),
                   precision, PRECISIONS[precision].exporter)


def _ort(run: RunDir, cfg: Config, precision: str, model, calib: np.ndarray) -> Variant:
    def write(out: Path) -> None:
        export_ort_graph(model, precision, out, cfg.export.opset)
        write_genai_folder(out.parent, model.config, out.name, run.checkpoint)
    return Variant((ORT, GRAPH_VERSION, repr(ORT_GRAPHS[precision])), write, f"{ORT}/{precision}",
                   ORT_GRAPHS[precision].summary)


VARIANTS = {PORTABLE: _portable, ORT: _ort}


def export(cfg: Config, run: RunDir, precisions: list[str] | None = None, force: bool = False) -> dict:
    run.ensure_writable()
    precisions = precisions or cfg.export.precisions
    model = load_checkpoint(run.checkpoint)
    tokenizer = load_tokenizer(run.checkpoint)
    ckpt_hashes = run.artifact_hashes("finetune")
    if not ckpt_hashes:
        raise UserError(f"{run.checkpoint}: not recorded in {run.manifest_path}; rerun `gpt2-deploy finetune`")
    splits = prepare_data(cfg, run, tokenizer)
    d, e = cfg.data, cfg.export
    blocks = heldout_blocks(splits, d.calib_samples + e.parity_prompts, d.calib_block_size, "data.calib_samples")
    calib = blocks[:d.calib_samples]
    # prompts of different lengths, so the parity check covers left padding
    prompts = [row[: max(1, d.calib_block_size // 2 - 3 * i)].tolist() for i, row in enumerate(blocks[d.calib_samples:])]
    reference = None  # PyTorch's outputs on the prompts, computed once for every graph checked
    jobs = []
    if PORTABLE in e.targets:  # every other portable variant derives from fp32
        jobs += [(PORTABLE, p) for p in ["fp32"] + [p for p in precisions if p != "fp32"]]
    if ORT in e.targets:
        jobs += [(ORT, p) for p in precisions]
    report = _load_report(run)
    for target, precision in progress(jobs, total=len(jobs), description="export"):
        stage, folder = export_stage(precision, target), run.onnx(precision, target)
        where = folder.relative_to(run.root).as_posix()
        variant = VARIANTS[target](run, cfg, precision, model, calib)
        stage_fp = fingerprint(ckpt_hashes, e.opset, *variant.depends_on)
        if not force and run.is_fresh(stage, stage_fp):
            console.print(f"export: {where} is up to date")
            continue
        reference = reference or torch_reference(model, prompts, e.parity_tokens)
        started = time.perf_counter()
        with atomic_dir(folder) as tmp:  # a failure here leaves the last graph and its record as they were
            out = tmp / MODEL_FILE
            variant.write(out)
            graph = finish_graph(out)
            check_graph(graph, Contract.from_hf_config(model.config, target), where)
            seconds = time.perf_counter() - started
            parity, failures = graph_parity(out, precision, model.config, reference, prompts, e.parity_tokens,
                                            cfg.validate.budgets[precision], target)
            if failures:
                raise UserError(f"export {where}: the graph disagrees with PyTorch on ONNX Runtime "
                                f"({'; '.join(failures)}); nothing was written")
        run.forget(stage)  # the new graph is in place: the old record goes, then the new one comes
        files = sorted(p for p in folder.iterdir())
        key = variant.key
        report[key] = {"target": target, "export_seconds": round(seconds, 2), "bytes": sum(f.stat().st_size for f in files),
                       "files": [f.name for f in files], "opset": e.opset, "ir_version": graph.ir_version,
                       "graph": variant.graph, "parity_ort_cpu": parity}
        run.record(stage, [folder], stage_fp, {"export": cfg.section("export"), "data": cfg.section("data")},
                   {"checkpoint": ckpt_hashes})
        console.print(f"export: {where} {report[key]['bytes'] / 1e6:.1f} MB in {seconds:.1f}s; "
                      f"vs PyTorch: rel error {parity['rel_error']:.2e}, top-1 {parity['top1']:.3f}, "
                      f"greedy identical {parity['identical_tokens']:.3f}")
    atomic_write_json(run.reports / "export.json", report)
    return report


def _load_report(run: RunDir) -> dict:
    path = run.reports / "export.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
