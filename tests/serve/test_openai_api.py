"""OpenAI's completions API as the official `openai` client meets it, on a real server."""

import json
import random

import pytest
import torch

from pipeline.model import load_checkpoint
from pipeline.tokenizer import decoded, load_tokenizer, token_bytes

httpx = pytest.importorskip("httpx", reason="the [serve] extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed (the [dev] extra)")


@pytest.fixture(scope="module")
def client(server):
    url, run = server
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60), run.root.name


def native(server, prompts, max_new_tokens, **extra):
    url, _ = server
    return httpx.post(f"{url}/generate", json={"prompt": prompts, "max_new_tokens": max_new_tokens, **extra},
                      timeout=60).json()


def test_models_lists_the_run(client, server):
    openai_client, name = client
    models = openai_client.models.list().data
    assert [m.id for m in models] == [name] and models[0].owned_by == "gpt2-deploy"


def test_a_completion_matches_the_native_api(client, server):
    openai_client, name = client
    prompts = ["Return the number of", "This module"]
    reply = openai_client.completions.create(model=name, prompt=prompts, max_tokens=6, temperature=0)
    expected = native(server, prompts, 6)
    assert [c.text for c in reply.choices] == expected["completions"]
    assert [c.finish_reason for c in reply.choices] == expected["finish_reasons"]
    assert [c.index for c in reply.choices] == [0, 1] and reply.object == "text_completion"
    assert reply.usage.completion_tokens == sum(map(len, expected["tokens"]))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_stream_adds_up_to_the_completion_then_done(client, server):
    openai_client, name = client
    prompts = ["Return the number of", "This"]
    whole = openai_client.completions.create(model=name, prompt=prompts, max_tokens=12, temperature=0)
    chunks = list(openai_client.completions.create(model=name, prompt=prompts, max_tokens=12, temperature=0,
                                                   stream=True, stream_options={"include_usage": True}))
    texts, finishes = ["", ""], [None, None]
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert texts == [c.text for c in whole.choices] and finishes == [c.finish_reason for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    url, _ = server  # the raw stream ends as OpenAI's does
    with httpx.stream("POST", f"{url}/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 2,
                                                             "stream": True}, timeout=60) as reply:
        lines = [line for line in reply.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_a_stop_string_ends_the_text_before_it(client, server):
    openai_client, name = client
    free = native(server, "Return the number of", 24, ignore_eos=True)
    text = free["completions"][0]
    stop = text[len(text) // 2:len(text) // 2 + 3]  # three characters from the middle, wherever tokens split them
    cut = text[:text.index(stop)]
    reply = openai_client.completions.create(model=name, prompt="Return the number of", max_tokens=24, temperature=0,
                                             stop=[stop, "never in this text \u2603"], extra_body={"ignore_eos": True})
    assert reply.choices[0].text == cut and reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens < 24
    streamed = openai_client.completions.create(model=name, prompt="Return the number of", max_tokens=24,
                                                temperature=0, stop=stop, stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut


def test_seeded_sampling_repeats_and_echo_prepends_the_prompt(client):
    openai_client, name = client
    ask = dict(model=name, prompt="The", max_tokens=5, temperature=0.9, top_p=0.9, seed=4,
               extra_body={"top_k": 40, "repetition_penalty": 1.2})
    first, second = (openai_client.completions.create(**ask).choices[0].text for _ in range(2))
    assert first == second
    echoed = openai_client.completions.create(**ask, echo=True).choices[0].text
    assert echoed == "The" + first


@pytest.mark.parametrize("ask, status, param, message", [
    ({"temperature": 2.5}, 400, "temperature", "less than or equal to 2"),
    ({"top_p": 0}, 400, "top_p", "greater than 0"),
    ({"max_tokens": -1}, 400, "max_tokens", "greater than or equal to 0"),
    ({"max_tokens": 0}, 400, "max_tokens", "0 generates nothing; give at least 1, or echo true"),
    ({"max_tokens": 5000}, 400, None, "plus max_tokens=5000 exceeds the model's context of 256"),
    ({"n": 0}, 400, "n", "greater than or equal to 1"),
    ({"n": 65}, 400, "n", "n: 65 choices for each of 1 prompts exceed the 64 rows"),
    ({"logprobs": 21}, 400, "logprobs", "less than or equal to 20"),
    ({"logprobs": -1}, 400, "logprobs", "greater than or equal to 0"),
    ({"extra_body": {"top_k": -2}}, 400, "top_k", "greater than or equal to -1"),
    ({"stop": ["a", "b", "c", "d", "e"]}, 400, None, "at most 4"),
    ({"model": "gpt-4"}, 404, "model", "The model `gpt-4` does not exist"),
])
def test_out_of_range_requests_get_openai_errors(client, ask, status, param, message):
    openai_client, name = client
    with pytest.raises(openai.APIStatusError) as caught:
        openai_client.completions.create(**{"model": name, "prompt": "hi", **ask})
    body = caught.value.body
    assert caught.value.status_code == status and message in body["message"] and body["param"] == param


def test_bounded_fuzz_on_completions_never_gets_a_5xx(server):
    url, run = server
    rng = random.Random(1)
    values = [None, True, "yes", -1, 0, 1, 2**64, 1e308, 2.5, [], {}, ["a", 1], "\ud800", "x" * 3000, {"include_usage": 1}]
    keys = ["prompt", "model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options",
            "echo", "n", "logprobs", "repetition_penalty", "ignore_eos", "presence_penalty"]
    for _ in range(120):
        body = {k: rng.choice(values) for k in rng.sample(keys, rng.randint(0, 5))}
        if rng.random() < 0.7:
            body["model"], body["prompt"] = run.root.name, rng.choice(["hi", ["a", "b"], "", "\ud800"])
        reply = httpx.post(f"{url}/v1/completions", content=json.dumps(body).encode(),
                           headers={"content-type": "application/json"}, timeout=60)
        assert reply.status_code < 500, (body, reply.text)
        if reply.status_code >= 400:
            assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


EXTREMES = [0.0, 5e-324, 1e-320, 1e-38, 1e-5, 2.0, 1e308, -1e-38, -2.0, -1e308]
SAMPLING_FIELDS = ["temperature", "top_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]


def test_extreme_sampling_values_are_answered_or_refused_and_never_hurt_the_requests_beside_them(exported_run, tmp_path):
    """A bounded fuzz loop on the continuous scheduler: every sampling field at subnormal, tiny, huge and
    negative values, each request sent while innocent ones (greedy, and seeded sampled with penalties)
    run beside it. The odd request gets 200 or a 4xx naming the field, never a 5xx; each innocent
    request gets the tokens it gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.serve.conftest import start_server, stop_server

    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path / "server.log", "--backend", "torch-compiled", "--precision", "fp32",
                             "--max-rows", "4")
    name = run.root.name
    innocents = [{"model": name, "prompt": "The module", "max_tokens": 10, "temperature": 0, "ignore_eos": True},
                 {"model": name, "prompt": "Return the", "max_tokens": 10, "temperature": 0.9, "top_p": 0.9, "seed": 7,
                  "presence_penalty": 0.5, "repetition_penalty": 1.2, "ignore_eos": True}]

    def send(body):
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        return reply.status_code, reply.json()

    try:
        alone = [send(body) for body in innocents]
        assert all(status == 200 for status, _ in alone)
        with ThreadPoolExecutor(3) as pool:
            for field in SAMPLING_FIELDS:
                for value in EXTREMES:
                    odd = {"model": name, "prompt": "Hello", "max_tokens": 3, "temperature": 1.0, field: value}
                    replies = list(pool.map(send, [odd, *innocents]))
                    status, body = replies[0]
                    assert status < 500, (field, value, body)
                    if status != 200:
                        assert body["error"]["param"] == field, (field, value, body)
                    for (status, got), (_, want) in zip(replies[1:], alone):
                        assert status == 200 and got["choices"][0]["text"] == want["choices"][0]["text"], (field, value)
    finally:
        stop_server(proc)


def test_n_choices_per_prompt_are_drawn_apart_and_repeat_under_a_seed(client, server):
    openai_client, name = client
    ask = dict(model=name, prompt=["The module", "Return the"], max_tokens=8, temperature=1.0, seed=11, n=3)
    first, again = (openai_client.completions.create(**ask) for _ in range(2))
    assert [c.index for c in first.choices] == list(range(6))
    texts = [c.text for c in first.choices]
    assert texts == [c.text for c in again.choices]  # seeded: the same choices
    assert len(set(texts[:3])) > 1 and len(set(texts[3:])) > 1  # each choice on a stream of its own
    single = openai_client.completions.create(model=name, prompt="The module", max_tokens=8, temperature=1.0, seed=11)
    assert first.usage.prompt_tokens == single.usage.prompt_tokens + openai_client.completions.create(
        model=name, prompt="Return the", max_tokens=1).usage.prompt_tokens  # each prompt counted once
    url, _ = server
    reply = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": "hi", "n": 10_000}, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["message"].startswith("n: 10000 choices")


def eager_logprobs(run, sequence: list[int]) -> torch.Tensor:
    """The checkpoint's log-softmax at every position of the sequence, in eager PyTorch fp32."""
    with torch.no_grad():
        return torch.log_softmax(load_checkpoint(run.checkpoint)(torch.tensor([sequence])).logits[0].float(), -1)


def test_logprobs_and_echo_are_the_eager_models_and_the_client_reads_them(client, server):
    """Each token's log-probability and its top alternatives against eager PyTorch's log-softmax
    (within 1e-3), for a sampled choice's tokens (the native API's, under the same seed) and, with
    echo, the prompt's; n choices are each scored."""
    openai_client, name = client
    _, run = server
    tokenizer = load_tokenizer(run.checkpoint)
    prompt = "Return the number of"
    ids = tokenizer.encode(prompt)
    drawn = native(server, prompt, 6, do_sample=True, temperature=0.9, seed=3)["tokens"][0]
    reply = openai_client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0.9, seed=3, n=2,
                                             logprobs=3, echo=True)
    sequence = ids + drawn
    eager = eager_logprobs(run, sequence)
    for index, choice in enumerate(reply.choices):
        lp = choice.logprobs
        assert "".join(lp.tokens) == choice.text and lp.text_offset[0] == 0
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing before the first token
        scored = len(sequence) if index == 0 else len(ids)  # the second choice drew other tokens than the native row
        assert lp.tokens[:scored] == [tokenizer.decode([t]) for t in sequence[:scored]]
        for t in range(1, scored):
            assert abs(lp.token_logprobs[t] - eager[t - 1, sequence[t]].item()) < 1e-3
            best = eager[t - 1].topk(3)
            assert len(lp.top_logprobs[t]) in (3, 4)  # the top 3, and the chosen token where it is not among them
            for i, value in zip(best.indices.tolist(), best.values.tolist()):
                assert abs(lp.top_logprobs[t][tokenizer.decode([i])] - value) < 1e-3
        assert all(v <= 0 for v in lp.token_logprobs[1:])
    plain = openai_client.completions.create(model=name, prompt=prompt, max_tokens=6, temperature=0, logprobs=0)
    lp = plain.choices[0].logprobs
    assert "".join(lp.tokens) == plain.choices[0].text and lp.text_offset[0] == len(prompt)
    assert all(len(top) == 1 for top in lp.top_logprobs)  # logprobs 0: the chosen token's alone


def test_echo_with_max_tokens_zero_scores_the_prompt_and_a_stream_sends_it_whole(client, server):
    """What scoring clients send (lm-evaluation-harness' loglikelihood): echo, logprobs, max_tokens 0."""
    openai_client, name = client
    url, run = server
    prompts = ["The module returns", "Return the number of"]
    reply = openai_client.completions.create(model=name, prompt=prompts, max_tokens=0, echo=True, logprobs=1)
    assert reply.usage.completion_tokens == 0
    tokenizer = load_tokenizer(run.checkpoint)
    for prompt, choice in zip(prompts, reply.choices):
        ids = tokenizer.encode(prompt)
        eager = eager_logprobs(run, ids)
        assert choice.text == prompt and choice.finish_reason == "length"
        want = sum(eager[t - 1, ids[t]].item() for t in range(1, len(ids)))
        assert abs(sum(choice.logprobs.token_logprobs[1:]) - want) < 1e-3
    chunks = list(openai_client.completions.create(model=name, prompt=prompts[0], max_tokens=4, temperature=0,
                                                   logprobs=2, stream=True, stream_options={"include_usage": True}))
    whole = openai_client.completions.create(model=name, prompt=prompts[0], max_tokens=4, temperature=0, logprobs=2)
    assert chunks[0].choices[0].text == whole.choices[0].text
    assert chunks[0].choices[0].logprobs.token_logprobs == pytest.approx(whole.choices[0].logprobs.token_logprobs, abs=1e-6)
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_token_id_prompts_are_scored_as_sent_as_lm_evaluation_harness_sends_them(client, server):
    """lm-evaluation-harness' local-completions (tokenized_requests, its default) sends a list of id
    lists with echo, logprobs 1 and max_tokens 1: the ids are scored as they are, never re-tokenized,
    and echo returns their text. A window that starts inside a multi-byte character still scores."""
    openai_client, name = client
    url, run = server
    tokenizer = load_tokenizer(run.checkpoint)
    whole = tokenizer.encode("I love 🐍 and 日本語 text")
    windows = [whole, whole[3:]]  # the second starts inside the snake's bytes: its text is not those ids' tokens
    assert tokenizer.encode(tokenizer.decode(windows[1])) != windows[1]
    reply = openai_client.completions.create(model=name, prompt=windows, max_tokens=1, echo=True, logprobs=1,
                                             temperature=0)
    for ids, choice in zip(windows, reply.choices):
        eager = eager_logprobs(run, ids)
        scored = choice.logprobs.token_logprobs[1:len(ids)]
        assert scored == pytest.approx([eager[t - 1, ids[t]].item() for t in range(1, len(ids))], abs=1e-3)
        assert choice.text.startswith(decoded(token_bytes(tokenizer), ids))  # the ids' text, then the new token's
    single = httpx.post(f"{url}/v1/completions", json={"model": name, "prompt": whole, "max_tokens": 2, "temperature": 0},
                        timeout=30).json()
    assert single["choices"][0]["text"] == openai_client.completions.create(
        model=name, prompt="I love 🐍 and 日本語 text", max_tokens=2, temperature=0).choices[0].text


def test_text_offsets_count_characters_of_the_returned_text(client):
    openai_client, name = client
    text = "I love 🐍 and 日本語 text"
    reply = openai_client.completions.create(model=name, prompt=text, max_tokens=1, echo=True, logprobs=0,
                                             temperature=0)
    lp = reply.choices[0].logprobs
    starts = dict(zip(lp.tokens, lp.text_offset))
    assert starts[" and"] == text.index(" and") == 8 and starts[" text"] == text.index(" text") == 16


@pytest.mark.parametrize("prompt, message", [([5, 50257], "prompt 0: token 1 is 50257, not an id"),
                                             ([[3], [-1]], "prompt 1: token 0 is -1, not an id"),
                                             ([[]], "prompt 0 is empty")])
def test_token_ids_outside_the_vocabulary_get_a_400_naming_the_prompt_and_index(client, server, prompt, message):
    _, name = client
    url, _ = server
    for path, body in (("/v1/completions", {"model": name, "prompt": prompt}), ("/generate", {"prompt": prompt})):
        reply = httpx.post(f"{url}{path}", json=body, timeout=30)
        assert reply.status_code == 400 and message in reply.json()["error"]["message"], reply.text
