"""Prompts tokenised on the event loop or a worker thread, with the same ids and errors."""

import asyncio
import threading
from types import SimpleNamespace

import pytest

from pipeline.errors import UserError
from pipeline.runtime.sampling import Sampling
from pipeline.tokenizer import embedded_gpt2_tokenizer

pytest.importorskip("fastapi", reason="the [serve] extra is not installed")
from serve.streaming import INLINE_CHARS, Hub  # noqa: E402

TOKENIZER = embedded_gpt2_tokenizer()


def test_short_prompts_are_tokenised_on_the_event_loop_long_ones_on_a_thread_with_the_same_ids_and_errors():
    hub = Hub(TOKENIZER, SimpleNamespace(info={"context": 1024}), max_prompts=4, timeout_s=1.0, metrics=None)
    threads, encode = [], hub.encode

    def recorded(*args):
        threads.append(threading.get_ident())
        return encode(*args)

    hub.encode = recorded
    short, long = "The cat sat on the mat.", "word " * (INLINE_CHARS // 5 + 1)

    async def tokenize(texts, max_new_tokens=8):
        return await hub.tokenize(texts, Sampling(max_new_tokens=max_new_tokens), "max_tokens")

    async def main():
        loop = threading.get_ident()
        assert await tokenize([short]) == [TOKENIZER(short)["input_ids"]] and threads[-1] == loop
        assert await tokenize([long]) == [TOKENIZER(long)["input_ids"]] and threads[-1] != loop
        for texts in ([short], [long]):  # the same UserError, wherever it was raised
            with pytest.raises(UserError, match="exceeds the model's context of 1024"):
                await tokenize(texts, max_new_tokens=1024)
    asyncio.run(main())
