"""The files that make an ORT-target graph's folder an onnxruntime-genai model: `genai_config.json`
(the model's shape, its inputs and outputs by contract name, greedy search over a cache shared
between past and present) and the tokenizer files onnxruntime-genai reads (tokenizer.json and
tokenizer_config.json, copied from the checkpoint). onnxruntime-genai's model builder knows no
GPT-2, so the exporter writes these itself, with the keys that builder writes for its models."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pipeline.contract import LOGITS, TOKEN_INPUTS, Contract

CONFIG_FILE = "genai_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def genai_config(config, model_file: str) -> dict:
    """config: the checkpoint's GPT2Config."""
    contract = Contract.from_hf_config(config)
    eos = config.eos_token_id
    return {
        "model": {
            "type": "decoder",  # onnxruntime-genai's generic decoder: inputs and outputs named below
            "bos_token_id": config.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": eos,  # GPT-2 has no pad token: its batches pad with end-of-text
            "context_length": config.n_positions,
            "vocab_size": contract.vocab_size,
            "decoder": {
                "filename": model_file,
                "session_options": {"log_id": "gpt2-deploy", "provider_options": []},
                "head_size": contract.head_dim,
                "hidden_size": config.n_embd,
                "num_attention_heads": contract.n_head,
                "num_key_value_heads": contract.n_head,
                "num_hidden_layers": contract.n_layer,
                "inputs": {**{name: name for name in TOKEN_INPUTS},
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": LOGITS, "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "num_beams": 1, "num_return_sequences": 1, "max_length": config.n_positions,
                   "min_length": 0, "past_present_share_buffer": True, "early_stopping": True,
                   "repetition_penalty": 1.0, "temperature": 1.0, "top_k": 1, "top_p": 1.0,
                   "length_penalty": 1.0, "no_repeat_ngram_size": 0, "diversity_penalty": 0.0},
    }


def write_genai_folder(folder: Path, config, model_file: str, checkpoint: Path) -> None:
    """Write genai_config.json and copy the tokenizer files into folder (beside model_file)."""
    (folder / CONFIG_FILE).write_text(json.dumps(genai_config(config, model_file), indent=2) + "\n", encoding="utf-8")
    for name in TOKENIZER_FILES:
        shutil.copy(checkpoint / name, folder / name)
