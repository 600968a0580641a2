"""What a read of the ``leveret`` data source returns: READ_SCHEMA, a delivery as a row,
and rows handed to Spark as Arrow record batches.

A Python data source's read() may yield tuples or ``pyarrow.RecordBatch`` objects. For
tuples, Spark's worker calls a converter per cell and builds the Arrow batch itself
(fifteen calls a row here); a reader that transposes its rows and builds the batch
column by column pays about a tenth of that (bench/spark_bench.py).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

DEATH_TYPE = StructType(
    [
        StructField("reason", StringType()),
        StructField("queue", StringType()),
        StructField("exchange", StringType()),
        StructField("routing_keys", ArrayType(StringType())),
        StructField("count", LongType()),
        StructField("time", TimestampType()),
    ]
)

#: What a read returns (batch or streaming, queue or stream).
READ_SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("exchange", StringType()),
        StructField("routing_key", StringType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("message_id", StringType()),
        StructField("correlation_id", StringType()),
        StructField("content_type", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("delivery_mode", IntegerType()),
        StructField("priority", IntegerType()),
        StructField("redelivered", BooleanType()),
        StructField("delivery_count", LongType()),
        StructField("offset", LongType()),  # streams: x-stream-offset
        StructField("lease_seq", LongType()),  # leased queue reads: x-lease-seq
        StructField("deaths", ArrayType(DEATH_TYPE)),  # x-death, most recent first
    ]
)

# headers that become columns rather than entries of ``headers``
_COLUMN_HEADERS = {"x-death", "x-stream-offset", "x-lease-seq", "x-delivery-count"}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):  # pamqp decodes x as a bytearray
        return value.decode("utf-8", "replace")
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, _dt.datetime):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def as_int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def delivery_row(d: Any) -> tuple:
    """A delivery (:class:`leveret.amqp.delivery.Delivery`) as a tuple in READ_SCHEMA
    order."""
    p = d.props
    raw = p.get("headers") or {}
    headers = {}
    deaths = []
    if raw:
        for key, value in raw.items():
            if key in _COLUMN_HEADERS:
                continue
            headers[key] = (
                value
                if isinstance(value, str)
                else _text(value)
                if isinstance(value, (bytes, bytearray))
                else json.dumps(value, default=_json_default)
            )
        for entry in raw.get("x-death") or []:
            if not isinstance(entry, dict):
                continue
            keys = entry.get("routing-keys") or []
            stamp = entry.get("time")
            deaths.append(
                (
                    _text(entry.get("reason")),
                    _text(entry.get("queue")),
                    _text(entry.get("exchange")),
                    [_text(k) for k in keys],
                    as_int(entry.get("count")),
                    stamp if isinstance(stamp, _dt.datetime) else None,
                )
            )
    get = p.get
    return (
        d.body,
        d.exchange,
        d.routing_key,
        headers,
        _text(get("message_id")),
        _text(get("correlation_id")),
        _text(get("content_type")),
        get("timestamp"),
        get("delivery_mode"),
        get("priority"),
        d.redelivered,
        as_int(raw.get("x-delivery-count")) or 0,
        as_int(raw.get("x-stream-offset")),
        as_int(raw.get("x-lease-seq")),
        deaths,
    )


#: rows per record batch (Spark's default spark.sql.execution.arrow.maxRecordsPerBatch)
BATCH_ROWS = 10_000
#: a batch also ends when its bodies reach this many bytes
BATCH_BYTES = 16 * 1024 * 1024


@cache
def arrow_schema() -> Any:
    """READ_SCHEMA as the Arrow schema Spark checks a yielded batch against (timestamps
    in microseconds, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(READ_SCHEMA, timezone="UTC")


def record_batch(rows: list[tuple]) -> Any:
    """``rows`` (tuples in READ_SCHEMA order) as one ``pyarrow.RecordBatch``."""
    import pyarrow as pa

    schema = arrow_schema()
    columns = zip(*rows) if rows else ([] for _ in schema)
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(columns, schema)], schema=schema
    )


def record_batches(rows: Iterable[tuple], body_index: int = 0) -> Iterator[Any]:
    """``rows`` in record batches of at most BATCH_ROWS rows or about BATCH_BYTES of
    bodies (column ``body_index``); nothing for no rows."""
    chunk: list[tuple] = []
    size = 0
    for row in rows:
        chunk.append(row)
        size += len(row[body_index])
        if len(chunk) >= BATCH_ROWS or size >= BATCH_BYTES:
            yield record_batch(chunk)
            chunk, size = [], 0
    if chunk:
        yield record_batch(chunk)
