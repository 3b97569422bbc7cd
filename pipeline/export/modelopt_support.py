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
    logging.getLogger("modelopt").propagate = False  # it also reaches the root logger otherwise: every line twice
    return mod
