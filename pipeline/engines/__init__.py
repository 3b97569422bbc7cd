"""TensorRT engines: one builder and one loader for the `tensorrt` and `tensorrt_rtx` flavours."""
