"""Rows of the ``leveret`` read schema handed to Spark as Arrow record batches.

A Python data source's read() may yield tuples or ``pyarrow.RecordBatch`` objects. For
tuples, Spark's worker calls a converter per cell and builds the Arrow batch itself
(fifteen calls a row here); a reader that transposes its rows and builds the batch
column by column pays about a tenth of that, which is most of the difference between
a connector that keeps up with Spark and one that does not (bench/spark_bench.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

#: rows per record batch (Spark's default spark.sql.execution.arrow.maxRecordsPerBatch)
BATCH_ROWS = 10_000
#: a batch also ends when its bodies reach this many bytes
BATCH_BYTES = 16 * 1024 * 1024


@cache
def arrow_schema() -> Any:
    """READ_SCHEMA as the Arrow schema Spark checks a yielded batch against (timestamps
    in microseconds, UTC)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from .source import READ_SCHEMA

    return to_arrow_schema(READ_SCHEMA, timezone="UTC")


def record_batch(rows: list[tuple]) -> Any:
    """``rows`` (tuples in READ_SCHEMA order) as one ``pyarrow.RecordBatch``."""
    import pyarrow as pa

    schema = arrow_schema()
    columns = zip(*rows) if rows else ([] for _ in schema)
    return pa.RecordBatch.from_arrays(
        [pa.array(column, type=field.type) for column, field in zip(columns, schema)],
        schema=schema)


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
