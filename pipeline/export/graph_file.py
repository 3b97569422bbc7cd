"""Writing and checking a graph file: the one writer every converter's graph goes through, its
weights beside it past the protobuf limit, and the checks export runs on what was written."""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.artifacts import graph_files

ONNX_PROTOBUF_LIMIT = 2 * 1024**3  # a single .onnx file cannot exceed 2 GB: larger weights go to .onnx.data


def needs_external_data(weight_bytes: int) -> bool:
    """Whether a graph with this many bytes of weights must keep them in `<graph>.data`: one protobuf
    cannot exceed 2 GB, and the graph's own nodes need some of it."""
    return weight_bytes > ONNX_PROTOBUF_LIMIT * 0.9


def save_graph(model: onnx.ModelProto, path: Path) -> None:
    """Write a converter's graph (weights in memory) to path, its weights in `<path>.data` past the
    protobuf limit, the one place the run folder's checks look for them (RunDir.require_exported)."""
    # the weights' size tensor by tensor: the whole graph's ByteSize fails past 2 GB (gpt2-xl)
    weight_bytes = sum(tensor.ByteSize() for tensor in model.graph.initializer)
    external, weights = needs_external_data(weight_bytes), graph_files(path)[1]
    onnx.save(model, str(path), save_as_external_data=external, location=weights.name)
    if external:  # onnx makes the weights' file private (0600); the graph beside it is readable
        weights.chmod(0o644)


def finish_graph(path: Path) -> onnx.ModelProto:
    """Drop converters' shape annotations, then run the ONNX checker and shape inference on the
    saved file (path-based: external data included); return the model without its weights.

    AutoCast, for one, annotates unrelated dims with one shared symbol ('unk'); ONNX Runtime then
    plans to reuse a [B, S, C] buffer for a [B, S, 3C] tensor and fails at run time."""
    model = onnx.load(str(path), load_external_data=False)
    del model.graph.value_info[:]
    onnx.save(model, str(path))
    onnx.checker.check_model(str(path), full_check=False)
    onnx.shape_inference.infer_shapes_path(str(path), str(path))
    return onnx.load(str(path), load_external_data=False)
