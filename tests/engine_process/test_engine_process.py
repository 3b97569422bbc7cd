"""The engine's inbox (Commands) over real pipes: submits become jobs, cancels and ends reach theirs,
and once every HTTP process has gone its jobs are cancelled and a wait ends the scheduler's loop.
An HTTP process's side (EngineClient) on a real event loop: what the engine's Outbox sends reaches
each job, and the engine's end reaches every job still running."""

import asyncio
import multiprocessing

import pytest
import torch

from pipeline.config import load_config
from pipeline.engine_process.child import Commands, Outbox
from pipeline.engine_process.messages import STARTED, Cancel, End, Score, Submit
from pipeline.engine_process.parent import EngineClient, QueueFull
from pipeline.model import new_model
from pipeline.runtime.jobs import InboxClosed
from pipeline.runtime.sampling import Sampling
from pipeline.runtime.scoring import Scorer, Scores, eager_logits


@pytest.fixture(scope="module")
def scorer():
    cfg = load_config("tiny", overrides=["model.n_layer=1", "model.n_embd=32", "model.n_head=2"])
    return Scorer(eager_logits(new_model(cfg.model, seed=0), torch.device("cpu")))


def channels(count: int):
    """(the engine's command readers, the HTTP processes' command writers, an Outbox over result pipes)"""
    readers, writers, results = [], [], []
    for _ in range(count):
        reader, writer = multiprocessing.Pipe(duplex=False)
        readers.append(reader)
        writers.append(writer)
        results.append(multiprocessing.Pipe(duplex=False))
    outbox = Outbox([w for _, w in results])
    outbox.readers = [r for r, _ in results]  # what the HTTP processes would read
    return readers, writers, outbox


def test_commands_become_jobs_and_reach_them(scorer):
    readers, writers, outbox = channels(2)
    commands = Commands(readers, outbox, lambda: scorer)
    assert commands.take(wait=False) == []
    greedy = Sampling(max_new_tokens=4)
    writers[0].send(Submit(7, [[464, 2068], [818]], greedy))
    writers[1].send(Submit(7, [[15496]], greedy))  # the same id from another HTTP process: its own job
    jobs = commands.take(wait=True)
    while len(jobs) < 2:  # the second pipe may turn ready a moment later
        jobs += commands.take(wait=True)
    first, second = sorted(jobs, key=lambda j: len(j.prompts), reverse=True)
    assert first.prompts == [[464, 2068], [818]] and second.prompts == [[15496]]
    writers[0].send(End(7, 1))
    writers[1].send(Cancel(7))
    writers[1].send(Cancel(99))  # a job the engine no longer has: nothing happens
    while not (first.ended and second.cancelled.is_set()):
        assert commands.take(wait=False) == []
    assert first.ended == {1} and not first.cancelled.is_set()
    first.on_start()
    assert outbox.pending == [((0, 7), "started")]


def test_the_scorer_is_made_by_the_first_score_and_kept(scorer):
    readers, writers, outbox = channels(1)
    made = []
    commands = Commands(readers, outbox, lambda: made.append(1) or scorer)
    writers[0].send(Submit(1, [[464]], Sampling(max_new_tokens=2)))
    commands.take(wait=True)
    assert not made  # generation alone never loads the scorer's weights
    for job in (3, 4):
        writers[0].send(Score(job, [[464, 2068]], [1], 1))
        commands.take(wait=False)
    assert made == [1]


def test_a_score_is_answered_between_steps_and_a_bad_one_gets_its_error(scorer):
    """A scoring command is no job of the scheduler's: the inbox answers it as it reads it, at once."""
    readers, writers, outbox = channels(1)
    commands = Commands(readers, outbox, lambda: scorer)
    writers[0].send(Score(3, [[464, 2068, 7586]], [1], 2))
    writers[0].send(Score(4, [[464]], [0], 2))
    while commands.take(wait=False) == [] and not outbox.readers[0].poll(0.05):
        pass
    delivered = []
    while len(delivered) < 2:
        delivered += outbox.readers[0].recv()
    (first, (scores,)), (second, error) = sorted(delivered, key=lambda item: item[0])
    assert first == 3 and isinstance(scores, Scores) and len(scores.token_logprobs) == 2 and len(scores.top[0]) == 2
    assert scores == scorer.score([[464, 2068, 7586]], [1], 2)[0]
    assert second == 4 and isinstance(error, RuntimeError) and "ValueError: start is 0" in str(error)


def test_the_inbox_closes_once_every_http_process_has_gone(scorer):
    readers, writers, outbox = channels(2)
    commands = Commands(readers, outbox, lambda: scorer)
    writers[0].send(Submit(1, [[464]], Sampling(max_new_tokens=4)))
    running = commands.take(wait=True)[0]
    writers[0].close()
    assert commands.take(wait=False) == [] and running.cancelled.is_set()  # its HTTP process went
    writers[1].close()
    with pytest.raises(InboxClosed):
        commands.take(wait=True)


def test_an_http_process_reads_what_the_engine_sends_on_its_event_loop_until_the_engine_ends():
    commands_in, commands_out = multiprocessing.Pipe(duplex=False)
    results_in, results_out = multiprocessing.Pipe(duplex=False)
    waiting, loads = multiprocessing.Value("q", 0), []
    client = EngineClient((commands_out, results_in), {}, queue_cap=2, waiting=waiting,
                          on_load=lambda *counts: loads.append(counts))
    outbox, greedy = Outbox([results_out]), Sampling(max_new_tokens=4)

    async def main():
        client.attach(asyncio.get_running_loop())
        got = {name: asyncio.Queue() for name in ("a", "b")}
        a = client.submit([[464]], greedy, got["a"].put_nowait)
        b = client.submit([[818]], greedy, got["b"].put_nowait)
        with pytest.raises(QueueFull):  # two not yet started: the cap
            client.submit([[15496]], greedy, print)
        assert [commands_in.recv() for _ in range(2)] == [Submit(a.id, [[464]], greedy), Submit(b.id, [[818]], greedy)]
        for item in (STARTED, [11], None):  # a: started, a step, done
            outbox.put((0, a.id), item)
        outbox.put((0, 99), [5])  # a job this process no longer has: dropped
        outbox.flush()  # one message
        assert [await got["a"].get(), await got["a"].get()] == [[11], None]
        assert waiting.value == 1 and loads[-1] == (1, 0)  # b waits; a is gone
        results_out.close()  # the engine ends
        assert isinstance(await got["b"].get(), RuntimeError)
        assert not client.alive and waiting.value == 0 and loads[-1] == (0, 0)
    asyncio.run(asyncio.wait_for(main(), 10))
