"""fp32 graph -> strongly typed fp16 graph through ModelOpt AutoCast.

AutoCast runs the graph on calibration inputs and keeps in fp32 the nodes whose values leave
fp16's safe range (the attention mask add at -3.4e38 and the Softmax that reads it, here). The
KV cache and logits become fp16 at the graph's boundary, which halves the cache's memory
traffic; the embedding Gather is converted too, so the tied weight stays one fp16 tensor."""

from __future__ import annotations

from pathlib import Path

import onnx

from pipeline.export.graph_file import save_graph
from pipeline.export.graph_passes import dedupe_initializers
from pipeline.export.modelopt_support import modelopt


def convert_fp16(fp32_path: Path, out_path: Path, calibration_npz: Path) -> None:
    convert = modelopt("modelopt.onnx.autocast", "fp16 export").convert_to_mixed_precision
    graph = onnx.load(str(fp32_path), load_external_data=False)
    embedding_gathers = [n.name for n in graph.graph.node if n.op_type == "Gather" and n.input[0] in
                         {i.name for i in graph.graph.initializer}]
    # ModelOpt's own type inference, where ONNX's shape inference ran over the whole weighted graph six
    # times: the same graph, 25% less time at gpt2-large (docs/journal/performance.md, "AutoCast's type inference")
    model = convert(str(fp32_path), low_precision_type="fp16", keep_io_types=False,
                    calibration_data=str(calibration_npz), nodes_to_include=embedding_gathers, providers=["cpu"],
                    use_standalone_type_inference=True)
    dedupe_initializers(model)
    save_graph(model, out_path)
