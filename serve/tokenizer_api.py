"""The served model's tokenizer over HTTP, as vLLM's server offers it, so a client that counts its own
tokens (lm-evaluation-harness finds these routes and then needs no tokenizer files of its own) counts
them as this server does:

    POST /tokenize        {"prompt": "...", "add_special_tokens": true, "return_token_strs": false}
                          -> {"count", "max_model_len", "tokens": [...], "token_strs": [...] | null}
    POST /detokenize      {"tokens": [...]} -> {"prompt": "..."}
    GET  /tokenizer_info  the tokenizer's special tokens and context length

GPT-2 adds no special tokens to a text, so add_special_tokens changes nothing; it is taken because
clients send it."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from pipeline.tokenizer import decoded, encode
from serve.errors import UnknownModel
from serve.streaming import Hub


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tokens: list[int]
    model: str | None = None


def tokenizer_routes(hub: Hub, model_name: str) -> APIRouter:
    router, tok = APIRouter(), hub.tokenizer

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise UnknownModel(f"The model `{name}` does not exist; this server serves `{model_name}` (GET /v1/models)")

    @router.post("/tokenize")
    def tokenize(req: TokenizeRequest):
        check_model(req.model)
        ids = encode(tok, req.prompt, "prompt")
        strs = tok.convert_ids_to_tokens(ids) if req.return_token_strs else None
        return {"count": len(ids), "max_model_len": hub.context, "tokens": ids, "token_strs": strs}

    @router.post("/detokenize")
    def detokenize(req: DetokenizeRequest):
        check_model(req.model)
        return {"prompt": decoded(hub.table, hub.known_ids(req.tokens, "tokens", "tokens"))}

    @router.get("/tokenizer_info")
    def tokenizer_info():
        return {"tokenizer_class": type(tok).__name__, "model_max_length": hub.context,
                "eos_token": tok.eos_token, "bos_token": tok.bos_token, "pad_token": tok.pad_token,
                "unk_token": tok.unk_token, "add_bos_token": False, "vocab_size": len(hub.table)}

    return router
