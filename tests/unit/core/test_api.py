"""amq.leveret.api requests (leveret.core.api.handle), driven through core alone.

Bad input is answered ``{"ok": false, "error": ...}``; a bug inside an operation is not
swallowed into a reply but propagates (the server then logs it and closes the one
connection with 541). A :class:`BrokerCore` with a :class:`ManualClock`; no sockets.
"""

from __future__ import annotations

import json

import pytest

from leveret.core import BrokerCore, Message, api
from leveret.core.access import Access
from leveret.core.auth import UserDatabase
from leveret.core.clock import ManualClock
from leveret.core.message import Properties
from leveret.core.queues.features.leases import Lease
from leveret.core.session import Session

OWNER = "connection-1"  # stands for the requesting connection (exclusive ownership)
USERS = UserDatabase()  # guest, with every permission on "/"


@pytest.fixture
def vhost():
    vhost = BrokerCore(clock=ManualClock()).vhosts["/"]
    work = vhost.declare_queue("work", None)
    for i in range(5):
        work.enqueue(Message.build("", "work", b"m%d" % i, Properties()))
    vhost.declare_queue("log", None, durable=True, arguments={"x-queue-type": "stream"})
    vhost.declare_queue("private", "connection-2", exclusive=True)
    return vhost


def call(vhost, operation: str, body, reply_to: str | None = "replies") -> dict | None:
    """One request as a client publishes it: ``body`` a dict (sent as JSON) or raw
    bytes. Returns the decoded reply, or None when handle() routes none."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = Message.build(api.API_EXCHANGE, operation, raw,
                            Properties(reply_to=reply_to, correlation_id="c-1"))
    session = Session(vhost, Access(USERS, USERS.users["guest"], vhost.name), OWNER)
    reply = api.handle(session, request)
    if reply is None:
        return None
    assert (reply.exchange, reply.routing_key) == ("", "replies")
    assert reply.properties.correlation_id == "c-1"
    assert reply.properties.content_type == "application/json"
    return json.loads(reply.body)


# -- good requests ----------------------------------------------------------------------
def test_lease_operations_and_stream_info(vhost):
    assert call(vhost, "lease.acquire", {"queue": "work", "group": "g", "max": 3, "ttl_ms": 5000}) \
        == {"ok": True, "start": 1, "end": 4}
    assert call(vhost, "lease.ack", {"queue": "work", "group": "g", "seqs": [1, 7]}) \
        == {"ok": True, "acked": 1}
    assert call(vhost, "lease.release", {"queue": "work", "group": "g", "seqs": [2]}) \
        == {"ok": True, "released": 1}
    assert call(vhost, "lease.ack", {"queue": "work", "group": "g", "upto": 3, "from": 3}) \
        == {"ok": True, "acked": 1}
    assert call(vhost, "lease.info", {"queue": "work", "group": "g"}) \
        == {"ok": True, "next": 4, "held": 0}
    assert call(vhost, "lease.acquire", {"queue": "work", "group": "g", "max": 0}) \
        == {"ok": True, "start": 4, "end": 4}
    assert call(vhost, "stream.info", {"stream": "log"}) \
        == {"ok": True, "first": 0, "next": 0, "messages": 0}


# -- bad input: an error reply, never an exception ---------------------------------------
BIG = 2**63  # one past the largest sequence number
BAD_REQUESTS = [
    # (operation, body, text the error must contain)
    ("lease.launch", {}, "unknown operation 'lease.launch'"),
    ("lease.info", b"{not json", "the request body is not JSON"),
    ("lease.info", b"\xff\xfe\xfa", "the request body is not JSON"),
    ("lease.info", b"[" * 100_000, "nests too deeply"),
    ("lease.info", b"[1, 2]", "must be a JSON object"),
    ("lease.info", b"null", "must be a JSON object"),
    ("lease.info", b'"queue"', "must be a JSON object"),
    ("lease.info", {"group": "g"}, "'queue' must be a string"),
    ("lease.info", {"queue": 7, "group": "g"}, "'queue' must be a string"),
    ("lease.info", {"queue": "work", "group": ["g"]}, "'group' must be a string"),
    ("stream.info", {"stream": None}, "'stream' must be a string"),
    ("stream.info", {"stream": "work"}, "'work' is not a stream"),
    ("lease.acquire", {"queue": "work", "group": "g"}, "'max' must be an integer"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": "5"}, "'max' must be an integer"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": True}, "'max' must be an integer"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": 2.5}, "'max' must be an integer"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": -1}, "'max' must be an integer from 0"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": BIG}, "'max' must be an integer from 0"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": 1, "ttl_ms": 0}, "'ttl_ms' must be a positive"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": 1, "ttl_ms": "1s"},
     "'ttl_ms' must be a positive"),
    ("lease.acquire", {"queue": "work", "group": "g", "max": 1, "ttl_ms": 10**400},
     "'ttl_ms' must be a positive"),
    ("lease.ack", {"queue": "work", "group": "g"}, "'upto' must be an integer"),
    ("lease.ack", {"queue": "work", "group": "g", "upto": "3"}, "'upto' must be an integer"),
    ("lease.ack", {"queue": "work", "group": "g", "upto": 3, "from": "1"}, "'from' must be an integer"),
    ("lease.ack", {"queue": "work", "group": "g", "upto": 3, "from": -1}, "'from' must be an integer from 0"),
    ("lease.ack", {"queue": "work", "group": "g", "upto": BIG}, "'upto' must be an integer from 0"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": "1,2"}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": None}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [1, [2]]}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [1, "x"]}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [1.5]}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [True]}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [-1]}, "'seqs' must be a list of integers"),
    ("lease.ack", {"queue": "work", "group": "g", "seqs": [BIG]}, "'seqs' must be a list of integers"),
    ("lease.release", {"queue": "work", "group": "g"}, "'seqs' must be a list of integers"),
    ("lease.release", {"queue": "work", "group": "g", "seqs": {"1": 1}}, "'seqs' must be a list of integers"),
]


@pytest.mark.parametrize("operation,body,error", BAD_REQUESTS)
def test_bad_input_gets_an_error_reply(vhost, operation, body, error):
    reply = call(vhost, operation, body)
    assert reply["ok"] is False
    assert error in reply["error"], reply["error"]
    assert "condition" not in reply  # not a broker error
    assert call(vhost, operation, body, reply_to=None) is None  # no reply_to: no reply, no raise
    # nothing was taken from the queue or leased on the way
    assert vhost.queues["work"].message_count == 5
    assert not vhost.queues["work"].leases


@pytest.mark.parametrize("operation,body,condition,error", [
    ("lease.acquire", {"queue": "nope", "group": "g", "max": 1}, "not_found", "NOT_FOUND - no queue 'nope'"),
    ("stream.info", {"stream": "nope"}, "not_found", "NOT_FOUND - no queue 'nope'"),
    ("lease.info", {"queue": "private", "group": "g"}, "resource_locked", "RESOURCE_LOCKED"),
    ("lease.acquire", {"queue": "log", "group": "g", "max": 1}, "precondition_failed", "is a stream"),
])
def test_broker_errors_carry_their_condition(vhost, operation, body, condition, error):
    reply = call(vhost, operation, body)
    assert reply["ok"] is False and reply["condition"] == condition
    assert error in reply["error"], reply["error"]


# -- a bug propagates -------------------------------------------------------------------
def test_a_programming_error_in_an_operation_propagates(vhost, monkeypatch):
    def broken(session, request):
        return {"next": session.no_such_attribute}

    monkeypatch.setitem(api.OPERATIONS, "lease.info", broken)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        call(vhost, "lease.info", {"queue": "work", "group": "g"})


@pytest.mark.parametrize("error", [TypeError, KeyError, ValueError])
def test_a_bug_below_the_api_propagates_even_on_a_valid_request(vhost, monkeypatch, error):
    """A valid request reaching a broken core method: ValueError included, which the
    API itself uses for bad input (APIError), so only explicit validation may answer."""
    def broken_ack(self, seqs):
        raise error("bug")

    monkeypatch.setattr(Lease, "ack", broken_ack)
    with pytest.raises(error):
        call(vhost, "lease.ack", {"queue": "work", "group": "g", "seqs": [1]})
