"""Spark connector and pipeline jobs for leveret (``pip install 'leveret[spark]'``).

``register(spark)`` makes ``format("leveret")`` available to a SparkSession::

    from leveret.spark import register
    register(spark)
    df.write.format("leveret").option("url", url).option("routingKey", "q").save()

See :mod:`leveret.spark.source` for the options and :mod:`leveret.spark.jobs` for the
``leveret pipeline`` jobs (dlq-report, dlq-replay, archive).
"""

from __future__ import annotations

from typing import Any

__all__ = ["READ_SCHEMA", "LeveretDataSource", "OptionError", "register"]


def register(spark: Any) -> None:
    """Register the ``leveret`` data source on ``spark`` (a SparkSession)."""
    from .source import LeveretDataSource

    spark.dataSource.register(LeveretDataSource)


def __getattr__(name: str) -> Any:  # lazy: importing leveret.spark must not need pyspark
    if name in ("LeveretDataSource", "OptionError", "READ_SCHEMA"):
        from . import source

        return getattr(source, name)
    raise AttributeError(name)
