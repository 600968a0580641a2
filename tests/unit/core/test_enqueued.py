"""The confirm outcome of an enqueue: ``|`` combines the outcomes of every queue a
publish reaches and never leaves the four members (:mod:`leveret.core.queues.outcome`)."""

from __future__ import annotations

import itertools

from leveret.core.queues import Enqueued


def test_combining_two_outcomes_gives_an_outcome():
    for a, b in itertools.product(Enqueued, repeat=2):
        combined = Enqueued(a | b)
        assert combined >= max(a, b) or combined is Enqueued.STORED_REJECTED


def test_a_store_wait_and_a_refusal_combine_to_both():
    assert Enqueued(Enqueued.STORED | Enqueued.REJECTED) is Enqueued.STORED_REJECTED
    assert Enqueued(Enqueued.ACCEPTED | Enqueued.STORED) is Enqueued.STORED
    assert Enqueued(Enqueued.REJECTED | Enqueued.ACCEPTED) is Enqueued.REJECTED
