"""Opening a link's AMQP connection (aiormq, as the shovels) from a RabbitMQ-style URI:
its query keys read by :mod:`.uri` (TLS, ``heartbeat``, ``connection_timeout``,
``auth_mechanism``), and the upstream's ``connection.close`` during the handshake kept
with its reply code and text (aiormq reports a close in answer to ``connection.open``,
such as ``530 NOT_ALLOWED - vhost ... not found``, without them)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiormq
import pamqp.frame
from aiormq.exceptions import AuthenticationError, ConnectionClosed, ProbableAuthenticationError
from pamqp.commands import Connection as Methods

from ..shovel.worker import close_when_made
from .uri import connect_options


class _Connection(aiormq.Connection):
    """aiormq's connection, with the handshake's ``connection.close`` raised as
    ``ConnectionClosed(code, text)`` (``ProbableAuthenticationError(text)`` for 403)
    whichever method it answers."""

    @staticmethod
    async def _rpc(request: Any, writer: Any, frame_receiver: Any, wait_response: bool = True) -> Any:
        if isinstance(request, Methods.Open):  # the vhost's answer: open-ok or close
            writer.write(pamqp.frame.marshal(request, 0))
            await writer.drain()
            _, _, frame = await frame_receiver.get_frame()
            if isinstance(frame, Methods.Close):
                if frame.reply_code == 403:
                    raise ProbableAuthenticationError(frame.reply_text)
                raise ConnectionClosed(frame.reply_code, frame.reply_text)
            return frame
        return await aiormq.Connection._rpc(request, writer, frame_receiver, wait_response)


async def open_connection(uri: str, client_properties: dict[str, Any], default_timeout: float) -> Any:
    """An open connection to ``uri`` within ``connection_timeout`` (else ``default_timeout``
    seconds; ``asyncio.TimeoutError`` after it). Raises :class:`.uri.URIError` for a
    query value RabbitMQ would refuse, ``ssl.SSLError`` and aiormq's errors as they come.
    Several ``auth_mechanism`` keys: the next is tried when the upstream does not offer
    one, as RabbitMQ's client picks the first of its list the server offers."""
    options = connect_options(uri)
    kwargs: dict[str, Any] = {"client_properties": client_properties}
    if options.tls is not None:
        loop = asyncio.get_running_loop()
        kwargs["context"] = await loop.run_in_executor(None, options.tls.context)
        if options.tls.server_name is not None:
            kwargs["server_hostname"] = options.tls.server_name
    timeout = options.timeout if options.timeout is not None else default_timeout
    for number, mechanism in enumerate(options.mechanisms, 1):
        url = str(aiormq.connection.URL(options.uri).update_query(auth=mechanism.lower()))
        connection = _Connection(url, **kwargs)
        attempt = asyncio.ensure_future(connection.connect())
        try:
            await asyncio.wait_for(asyncio.shield(attempt), timeout)
        except AuthenticationError:  # the upstream does not offer this mechanism
            if number == len(options.mechanisms):
                raise
            continue
        except BaseException:  # timed out or stopped: a connection made later is closed
            attempt.add_done_callback(functools.partial(close_when_made_connection, made=connection))
            raise
        return connection
    raise AssertionError("no mechanism")  # connect_options gives at least one


def close_when_made_connection(attempt: asyncio.Future, made: Any) -> None:
    """Close ``made`` once its abandoned ``connect()`` succeeded."""
    if not attempt.cancelled() and attempt.exception() is None:
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        done.set_result(made)
        close_when_made(done)
