"""The engine's inbox (Commands) over real pipes: submits become jobs, cancels and ends reach theirs,
and once every HTTP process has gone its jobs are cancelled and a wait ends the scheduler's loop."""

import multiprocessing

import pytest

from pipeline.runtime.jobs import InboxClosed
from pipeline.runtime.sampling import Sampling
from serve.engine import Commands, Outbox


def channels(count: int):
    """(the engine's command readers, the HTTP processes' command writers, an Outbox over result pipes)"""
    readers, writers, results = [], [], []
    for _ in range(count):
        reader, writer = multiprocessing.Pipe(duplex=False)
        readers.append(reader)
        writers.append(writer)
        results.append(multiprocessing.Pipe(duplex=False)[1])
    return readers, writers, Outbox(results)


def test_commands_become_jobs_and_reach_them():
    readers, writers, outbox = channels(2)
    commands = Commands(readers, outbox)
    assert commands.take(wait=False) == []
    greedy = Sampling(max_new_tokens=4)
    writers[0].send(("submit", 7, [[464, 2068], [818]], greedy))
    writers[1].send(("submit", 7, [[15496]], greedy))  # the same id from another HTTP process: its own job
    jobs = commands.take(wait=True)
    while len(jobs) < 2:  # the second pipe may turn ready a moment later
        jobs += commands.take(wait=True)
    first, second = sorted(jobs, key=lambda j: len(j.prompts), reverse=True)
    assert first.prompts == [[464, 2068], [818]] and second.prompts == [[15496]]
    writers[0].send(("end", 7, 1))
    writers[1].send(("cancel", 7))
    writers[1].send(("cancel", 99))  # a job the engine no longer has: nothing happens
    while not (first.ended and second.cancelled.is_set()):
        assert commands.take(wait=False) == []
    assert first.ended == {1} and not first.cancelled.is_set()
    first.on_start()
    assert outbox.pending == [((0, 7), "started")]


def test_the_inbox_closes_once_every_http_process_has_gone():
    readers, writers, outbox = channels(2)
    commands = Commands(readers, outbox)
    writers[0].send(("submit", 1, [[464]], Sampling(max_new_tokens=4)))
    running = commands.take(wait=True)[0]
    writers[0].close()
    assert commands.take(wait=False) == [] and running.cancelled.is_set()  # its HTTP process went
    writers[1].close()
    with pytest.raises(InboxClosed):
        commands.take(wait=True)
