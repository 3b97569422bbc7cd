"""A scheduler's inbox: what a wait returns, and a job's prompts ended one by one."""

import threading

import pytest

from pipeline.runtime.jobs import Inbox, InboxClosed, Job
from pipeline.runtime.sampling import Sampling


def job(prompts: int = 1) -> Job:
    return Job([[464]] * prompts, Sampling(max_new_tokens=2), lambda item: None)


def test_a_wait_returns_every_job_that_came_and_a_look_returns_none_when_none_did():
    inbox = Inbox()
    assert inbox.take(wait=False) == []
    first, second = job(), job()
    inbox.submit(first)
    inbox.submit(second)
    assert inbox.take(wait=True) == [first, second]
    late = job()
    threading.Timer(0.05, inbox.submit, (late,)).start()
    assert inbox.take(wait=True) == [late]  # waited for it


def test_a_job_is_cancelled_once_every_prompt_is_ended():
    j = job(prompts=2)
    j.end(0)
    assert not j.cancelled.is_set()
    j.end(1)
    assert j.cancelled.is_set()


def test_a_closed_inbox_hands_over_the_jobs_before_its_close_then_ends():
    inbox = Inbox()
    first = job()
    inbox.submit(first)
    inbox.close()
    assert inbox.take(wait=True) == [first]
    with pytest.raises(InboxClosed):
        inbox.take(wait=False)
    with pytest.raises(InboxClosed):
        inbox.take(wait=True)  # a wait does not block on a closed inbox
