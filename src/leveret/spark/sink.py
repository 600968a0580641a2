"""The sink of the ``leveret`` data source: ``df.write.format("leveret")`` and
``writeStream.format("leveret")`` publish each row with publisher confirms.

A task returns only when the broker has confirmed every row it published (for
persistent messages on durable queues: on disk), and raises on a nack or a lost
connection, so Spark retries it. Each message carries a deterministic ``message_id``
(job or query id, batch id, partition, row), so a retried task or replayed micro-batch
is dropped by a queue declared with ``x-message-deduplication``: exactly-once end to end.
Rows arrive as Arrow record batches (``DataSourceArrowWriter``), which spares Spark
making a Row object per row. A ``deaths`` column (as a read returns it) is published as
the ``x-death`` header, so dead letters written back keep their history.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from ..amqp.client import AMQPError, BlockingClient, parse_url, safe_url
from ..amqp.field_table import Long
from .options import COMMON_OPTIONS, DEFAULT_URL, OptionError, Options, connect
from .rows import DEATH_TYPE

WRITE_OPTIONS = COMMON_OPTIONS | {
    "exchange",
    "routingkey",
    "persistent",
    "jobid",
    "confirmwindow",
    "checkpointlocation",
}

# message properties a row's ``properties`` map may set
_PROPERTY_NAMES = {
    "content_type",
    "content_encoding",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
    "priority",
    "delivery_mode",
}

# fields of a ``deaths`` entry (rows.DEATH_TYPE) by their x-death key
_DEATH_KEYS = {
    "reason": "reason",
    "queue": "queue",
    "exchange": "exchange",
    "routing_keys": "routing-keys",
    "count": "count",
    "time": "time",
}


@dataclass
class WriteConfig:
    url: str
    exchange: str
    routing_key: str
    persistent: bool
    job_id: str
    window: int
    timeout: float
    columns: dict[str, int]

    @classmethod
    def from_options(cls, options: Any, schema: StructType) -> WriteConfig:
        opts = Options(options, WRITE_OPTIONS, "sink")
        columns = _check_write_schema(schema)
        url = opts.text("url", DEFAULT_URL)
        try:
            parse_url(url)
        except AMQPError as exc:
            raise OptionError(f"leveret option url: {exc}") from None
        return cls(
            url=url,
            exchange=opts.text("exchange", ""),
            routing_key=opts.text("routingKey", ""),
            persistent=opts.flag("persistent", True),
            job_id=opts.text("jobId") or uuid.uuid4().hex,
            window=opts.integer("confirmWindow", 2000, minimum=1),
            timeout=opts.number("timeout", 30.0),
            columns=columns,
        )

    def check_broker(self) -> None:
        """Fail on the driver, before any task runs: unreachable broker, refused login,
        missing exchange."""
        with connect(self.url, min(self.timeout, 10.0)) as client:
            if self.exchange and not client.exchange_exists(self.exchange):
                raise OptionError(
                    f"leveret option exchange: no exchange {self.exchange!r} on {safe_url(self.url)}"
                )


def _check_write_schema(schema: StructType) -> dict[str, int]:
    """The index of each column the sink uses, by lower-case name; OptionError naming the
    column if ``body`` is missing or a column has the wrong type."""
    names = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}
    if "body" not in names:
        raise OptionError(
            "leveret sink: the DataFrame needs a 'body' column (binary or string); "
            f"its columns are {[f.name for f in schema.fields]}"
        )
    expected = {
        "body": (BinaryType, StringType),
        "routing_key": (StringType,),
        "exchange": (StringType,),
        "headers": (MapType,),
        "properties": (MapType,),
    }
    columns = {}
    for name, types in expected.items():
        if name not in names:
            continue
        index, dtype = names[name]
        if not isinstance(dtype, types) or (
            isinstance(dtype, MapType) and not isinstance(dtype.keyType, StringType)
        ):
            wanted = {
                "body": "binary or string",
                "headers": "map<string,...>",
                "properties": "map<string,string>",
            }.get(name, "string")
            raise OptionError(f"leveret sink: column {name!r} must be {wanted}, not {dtype.simpleString()}")
        columns[name] = index
    if "deaths" in names:
        index, dtype = names["deaths"]
        if not _is_deaths_type(dtype):
            raise OptionError(
                f"leveret sink: column 'deaths' must be "
                f"{ArrayType(DEATH_TYPE).simpleString()} (as a read returns "
                f"it), not {dtype.simpleString()}"
            )
        columns["deaths"] = index
    return columns


def _is_deaths_type(dtype: Any) -> bool:
    """``array<struct<...>>`` with DEATH_TYPE's fields (any order, any nullability)."""
    if not isinstance(dtype, ArrayType) or not isinstance(dtype.elementType, StructType):
        return False
    fields = {f.name: f.dataType.simpleString() for f in dtype.elementType.fields}
    return fields == {f.name: f.dataType.simpleString() for f in DEATH_TYPE.fields}


@dataclass
class LeveretCommit(WriterCommitMessage):
    partition: int
    published: int


def _property_value(name: str, value: str) -> Any:
    if name in ("priority", "delivery_mode"):
        return int(value)
    if name == "timestamp":
        text = value.strip()
        if text.lstrip("-").isdigit():
            return _dt.datetime.fromtimestamp(int(text), _dt.UTC)
        stamp = _dt.datetime.fromisoformat(text)
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=_dt.UTC)
    return value


def _header_value(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytearray(value)  # a byte array ('x'), as pika writes bytes
    if isinstance(value, _dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=_dt.UTC)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _header_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_header_value(v) for v in value]
    return str(value)


def _x_death(deaths: list[dict | None]) -> list[dict]:
    """A row's ``deaths`` (DEATH_TYPE entries as Arrow gives them: dicts, most recent
    first) as the ``x-death`` header value in RabbitMQ's shape: a table per entry with
    ``reason``, ``queue``, ``exchange`` (long strings), ``routing-keys`` (an array of
    long strings), ``count`` (a long, ``l``, as RabbitMQ writes it) and ``time`` (a
    timestamp, whole seconds, naive taken as UTC). Null entries and null fields are left
    out."""
    return [
        {
            _DEATH_KEYS[key]: Long(value) if key == "count" else _header_value(value)
            for key, value in death.items()
            if value is not None and key in _DEATH_KEYS
        }
        for death in deaths
        if death is not None
    ]


def columns_of(config: WriteConfig, batches: Iterator[Any]) -> Iterator[tuple]:
    """(body, routing_key, exchange, headers, properties, deaths) of each row of the
    Arrow record ``batches``; None for a column the DataFrame does not have, maps as
    lists of (key, value) pairs, ``deaths`` as a list of dicts."""
    cols = config.columns
    names = ("body", "routing_key", "exchange", "headers", "properties", "deaths")
    for batch in batches:
        yield from zip(
            *(
                repeat(None) if cols.get(name) is None else batch.column(cols[name]).to_pylist()
                for name in names
            )
        )


def publish_rows(config: WriteConfig, rows: Iterator[tuple], id_prefix: str) -> int:
    """Publish ``rows`` (as :func:`columns_of` makes them) with publisher confirms;
    returns the count when every one is confirmed. A non-empty ``deaths`` becomes the
    ``x-death`` header (replacing one in ``headers``). Raises AMQPError (with the URL)
    on a nack, a closed channel or a lost connection, ValueError on a null body or an
    unknown property."""
    mode = 2 if config.persistent else 1
    window = config.window
    low = window // 2
    count = 0
    with BlockingClient(config.url, timeout=config.timeout) as client:
        client.confirm_select()
        for body, key, exchange, headers, properties, deaths in rows:
            if body is None:
                raise ValueError(f"leveret sink: row {count} has a null body")
            if isinstance(body, str):
                body = body.encode()
            fields: dict[str, Any] = {"delivery_mode": mode, "message_id": f"{id_prefix}{count}"}
            if headers:
                fields["headers"] = {str(k): _header_value(v) for k, v in headers}
            if deaths and (x_death := _x_death(deaths)):
                fields.setdefault("headers", {})["x-death"] = x_death
            if properties:
                fields.update(_properties(properties))
            client.publish(
                config.exchange if exchange is None else exchange,
                config.routing_key if key is None else key,
                body,
                fields,
            )
            count += 1
            if client.unconfirmed >= window:
                client.wait_confirms(low)
        client.wait_confirms(0, timeout=max(config.timeout, 60.0))
    return count


def _properties(pairs: list[tuple[str, str | None]]) -> dict[str, Any]:
    """A row's ``properties`` map as message properties by pamqp attribute name."""
    fields = {}
    for name, value in pairs:
        if name not in _PROPERTY_NAMES:
            raise ValueError(
                f"leveret sink: unknown message property {name!r} in the "
                f"properties column; known: {', '.join(sorted(_PROPERTY_NAMES))}"
            )
        if value is not None:
            fields["message_type" if name == "type" else name] = _property_value(name, value)
    return fields


def _task_context() -> Any:
    from pyspark import TaskContext

    return TaskContext.get()


class LeveretBatchWriter(DataSourceArrowWriter):
    def __init__(self, config: WriteConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        ctx = _task_context()
        partition = ctx.partitionId() if ctx else 0
        prefix = f"{self.config.job_id}-p{partition}-"
        rows = columns_of(self.config, iterator)
        return LeveretCommit(partition, publish_rows(self.config, rows, prefix))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # every row is confirmed by the broker before its task ends

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # published messages cannot be taken back; a rerun with the same jobId is
        # deduplicated by queues declared with x-message-deduplication


class LeveretStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, config: WriteConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        ctx = _task_context()
        partition = ctx.partitionId() if ctx else 0
        query = (ctx.getLocalProperty("sql.streaming.queryId") if ctx else None) or self.config.job_id
        batch = (ctx.getLocalProperty("streaming.sql.batchId") if ctx else None) or "0"
        prefix = f"{query}-b{batch}-p{partition}-"
        rows = columns_of(self.config, iterator)
        return LeveretCommit(partition, publish_rows(self.config, rows, prefix))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # may run twice for a replayed batch: nothing to do, so harmless

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass
