"""The export stage: checkpoint -> one ONNX graph with a KV cache per precision (fp32, fp16,
int8 Q/DQ, int8 weight-only), each checked against PyTorch on ONNX Runtime as it is written."""
