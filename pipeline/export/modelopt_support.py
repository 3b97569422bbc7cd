"""Importing NVIDIA ModelOpt's ONNX tools: one clear error when it is missing, and its INFO-level
chatter (a line per skipped node) turned down to warnings."""

from __future__ import annotations

import importlib
import logging

from pipeline.errors import UserError


def modelopt(module: str, purpose: str):
    try:
        mod = importlib.import_module(module)
        from modelopt.onnx.logging_config import configure_logging
    except ImportError:
        raise UserError(f"{purpose} needs NVIDIA ModelOpt: pip install 'gpt2-deploy[quant]'") from None
    configure_logging(logging.WARNING)
    log = logging.getLogger("modelopt")
    log.propagate = False  # it also reaches the root logger otherwise: every line twice
    onnx_log = logging.getLogger("modelopt.onnx")  # a logger filter: quantize() replaces the handlers
    if not any(isinstance(f, NoGpuIsNoError) for f in onnx_log.filters):
        onnx_log.addFilter(NoGpuIsNoError())
    return mod


class NoGpuIsNoError(logging.Filter):
    """ModelOpt logs an ERROR when it finds no GPU to count; on a CPU machine that is expected, and its
    calibration runs on ONNX Runtime's CPU provider as this project asks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Failed to get GPU count" not in record.getMessage()
