"""lm-evaluation-harness, a client no one here wrote, against a real server with its defaults:
`local-completions` given only the URL and the model's name finds the tokenizer at /tokenize, then
sends token-id prompts with echo and logprobs. Three local tasks (no downloads): multiple choice,
loglikelihood and rolling loglikelihood (perplexity); every document's score is checked against
transformers' on the same checkpoint, fp32 on the CPU. The server runs torch-compiled, which scores on
the engine's own prefill (Backend.own_scoring; the eager scorer has test_openai_api's logprobs test)."""

import json
import math

import pytest
import torch

pytest.importorskip("httpx", reason="the [serve] extra is not installed")
lm_eval = pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (the [dev] extra)")
transformers = pytest.importorskip("transformers")

# short documents (the served context is 64 tokens), multi-byte characters among them
QUESTIONS = [
    {"question": "The module returns the", "choices": ["number of rows", "日本語 text", "🐍🐍"], "answer": 0},
    {"question": "Return the number of", "choices": ["tokens", "bytes in 🐍", "files"], "answer": 2},
    {"question": "This function reads", "choices": ["a file", "the file's header", "nothing at all"], "answer": 1},
    {"question": "Café society met in", "choices": ["Zürich", "the module", "a list"], "answer": 0},
]
CLOZE = [
    {"text": "The module returns the number", "target": " of rows"},
    {"text": "I love 🐍 and", "target": " 日本語"},
    {"text": "Return the", "target": " value"},
]
TEXTS = [
    {"text": "The module returns the number of rows in the table."},
    {"text": "I love 🐍 and 日本語 text, naïve café."},
    {"text": "Return the value."},
]
TASKS = {
    "gd_choice": (QUESTIONS, {"output_type": "multiple_choice", "doc_to_text": "{{question}}",
                              "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
                              "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}),
    "gd_cloze": (CLOZE, {"output_type": "loglikelihood", "doc_to_text": "{{text}}", "doc_to_target": "{{target}}",
                         "target_delimiter": "",
                         "metric_list": [{"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
                                         {"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}),
    "gd_text": (TEXTS, {"output_type": "loglikelihood_rolling", "doc_to_text": "", "doc_to_target": "{{text}}",
                        "metric_list": [{"metric": "word_perplexity", "aggregation": "weighted_perplexity",
                                         "higher_is_better": False}]}),
}


def write_tasks(folder) -> None:
    """Each task as lm-eval reads a local one: a YAML file whose data set is a JSON-lines file."""
    for name, (rows, spec) in TASKS.items():
        data = folder / f"{name}.jsonl"
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        task = {"task": name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(data)}},
                "test_split": "test", **spec}
        (folder / f"{name}.yaml").write_text(json.dumps(task, ensure_ascii=False), encoding="utf-8")  # JSON is YAML


class Reference:
    """transformers' GPT-2 on the run's checkpoint: what each request should score."""

    def __init__(self, checkpoint):
        self.tok = transformers.AutoTokenizer.from_pretrained(checkpoint)
        self.model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    @torch.no_grad()
    def score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        ids = torch.tensor([context + continuation])
        logprobs = torch.log_softmax(self.model(ids).logits[0, len(context) - 1:-1].float(), -1)
        chosen = logprobs[torch.arange(len(continuation)), continuation]
        return chosen.sum().item(), bool((logprobs.argmax(-1) == torch.tensor(continuation)).all())

    def pair(self, context: str, continuation: str) -> tuple[float, bool]:
        """lm-eval's split of a request into tokens: a context's trailing spaces go with the continuation,
        and the continuation's tokens are the whole text's after the context's."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, ctx = self.tok.encode(context + continuation), self.tok.encode(context)
        return self.score(ctx, whole[len(ctx):])

    def rolling(self, text: str) -> float:
        """One window (the texts are shorter than the context), after the end-of-text token lm-eval puts first."""
        return self.score([self.tok.eos_token_id], self.tok.encode(text))[0]


@pytest.fixture(scope="module")
def server(exported_run, tmp_path_factory):
    from tests.serve.conftest import start_server, stop_server

    _, run, _ = exported_run
    proc, url = start_server(run, tmp_path_factory.mktemp("serve") / "server.log",
                             pick=("--backend", "torch-compiled", "--precision", "fp32"))
    yield url, run
    stop_server(proc)


@pytest.fixture(scope="module")
def evaluated(server, tmp_path_factory):
    from lm_eval.tasks import TaskManager

    """lm-eval's run of the three tasks, given only what a user types: without the server's tokenizer
    routes it would look for a tokenizer named like the model on the Hub, and fail offline."""
    url, run = server
    folder = tmp_path_factory.mktemp("lm_eval_tasks")
    write_tasks(folder)
    results = lm_eval.simple_evaluate(model="local-completions", model_args={"base_url": f"{url}/v1/completions",
                                                                             "model": run.root.name},
                                      tasks=list(TASKS), task_manager=TaskManager(include_path=str(folder)),
                                      log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    return results, Reference(run.checkpoint)


def arguments(sample: dict) -> list[tuple]:
    """Each request of a logged document, as (context, continuation) or (text,)."""
    return [tuple(a.values()) for a in sample["arguments"].values()] if isinstance(sample["arguments"], dict) \
        else [tuple(a) for a in sample["arguments"]]


def test_it_found_the_servers_tokenizer_and_ran_every_document(evaluated):
    results, _ = evaluated
    for name, (rows, _) in TASKS.items():
        assert len(results["samples"][name]) == len(rows)
    assert results["config"]["model"] == "local-completions"


def test_multiple_choice_scores_and_accuracy_are_transformers(evaluated):
    results, ref = evaluated
    correct = 0
    for sample in results["samples"]["gd_choice"]:
        want = [ref.pair(*request) for request in arguments(sample)]
        got = [tuple(r[0]) for r in sample["resps"]]
        assert [g[0] for g in got] == pytest.approx([w[0] for w in want], abs=1e-4)
        correct += max(range(len(want)), key=lambda i: want[i][0]) == sample["doc"]["answer"]
    assert results["results"]["gd_choice"]["acc,none"] == pytest.approx(correct / len(QUESTIONS))


def test_loglikelihood_scores_and_greedy_flags_are_transformers(evaluated):
    results, ref = evaluated
    for sample in results["samples"]["gd_cloze"]:
        (request,) = arguments(sample)
        (got,) = [tuple(r[0]) for r in sample["resps"]]
        want = ref.pair(*request)
        assert got[0] == pytest.approx(want[0], abs=1e-4) and got[1] == want[1]


def test_rolling_loglikelihood_is_transformers_and_so_is_the_perplexity(evaluated):
    results, ref = evaluated
    total = words = 0.0
    for sample in results["samples"]["gd_text"]:
        text = sample["doc"]["text"]
        (got,) = sample["resps"][0]
        want = ref.rolling(text)
        assert got == pytest.approx(want, abs=1e-4)
        total, words = total + want, words + len(text.split())
    assert results["results"]["gd_text"]["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-4)
