"""The tokenizer routes (vLLM's /tokenize, /detokenize, /tokenizer_info) on a real server."""

import pytest

from pipeline.tokenizer import load_tokenizer

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")

TEXT = "I love 🐍 and 日本語 text"


def test_tokenize_gives_the_models_ids_and_detokenize_gives_the_text_back(server):
    url, run = server
    tokenizer = load_tokenizer(run.checkpoint)
    reply = httpx.post(f"{url}/tokenize", json={"prompt": TEXT, "add_special_tokens": False, "return_token_strs": True},
                       timeout=30).json()
    assert reply["tokens"] == tokenizer.encode(TEXT) and reply["count"] == len(reply["tokens"])
    assert reply["token_strs"] == tokenizer.convert_ids_to_tokens(reply["tokens"])
    assert reply["max_model_len"] == httpx.get(f"{url}/health", timeout=30).json()["context"]
    back = httpx.post(f"{url}/detokenize", json={"tokens": reply["tokens"], "model": run.root.name}, timeout=30).json()
    assert back == {"prompt": TEXT}
    assert httpx.post(f"{url}/tokenize", json={"prompt": "<|endoftext|>"}, timeout=30).json()["tokens"] == [
        tokenizer.eos_token_id]  # what a client that reads eos_token below takes for its id


def test_tokenizer_info_names_the_special_tokens(server):
    url, run = server
    info = httpx.get(f"{url}/tokenizer_info", timeout=30).json()
    tokenizer = load_tokenizer(run.checkpoint)
    assert info["eos_token"] == tokenizer.eos_token and info["model_max_length"] > 0
    assert info["vocab_size"] == len(tokenizer)


def test_bad_ids_and_an_unknown_model_are_refused_by_name(server):
    url, run = server
    reply = httpx.post(f"{url}/detokenize", json={"tokens": [1, 10**6]}, timeout=30)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith("tokens: token 1 is 1000000, not an id of this model's vocabulary")
    assert reply.json()["error"]["param"] == "tokens"
    reply = httpx.post(f"{url}/tokenize", json={"prompt": "hi", "model": "other"}, timeout=30)
    assert reply.status_code == 404 and reply.json()["error"]["param"] == "model"
    assert httpx.post(f"{url}/tokenize", json={"text": "hi"}, timeout=30).status_code == 422  # its field is prompt
