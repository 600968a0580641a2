"""Streaming jobs run as their own process by test_spark_crash.py (like spark-submit):

    python crash_job.py URL CHECKPOINT_DIR [stream:SOURCE:TARGET] [queue:SOURCE:TARGET]

It builds a local[2] SparkSession and starts one streaming query per argument, side by
side: each reads SOURCE (a leveret stream, or a queue through leases) with
format("leveret"), slows each row down a little so that a batch takes about a second,
and writes the bodies through the leveret sink to the queue TARGET, with a checkpoint
under CHECKPOINT_DIR and trigger(availableNow=True). The test SIGKILLs the process
mid-batch and starts it again on the same checkpoints. Exits 0 once every query has
written everything that was available when it started.

(One process for both queries: a JVM start costs several seconds on a small machine.)
"""

from __future__ import annotations

import os
import sys
import time


def _say(what: str) -> None:
    print(f"crash_job {time.strftime('%H:%M:%S')}: {what}", file=sys.stderr, flush=True)


def main() -> None:
    url, checkpoints = sys.argv[1:3]
    _say("starting")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession, functions as F

    from leveret.spark import register

    # local[2,4]: failed tasks are retried, as on a cluster. Two queries starting at
    # once in one JVM now and then fail a task deserialising it (OptionalDataException);
    # the retry reads the same offsets / lease range, and the sink's ids make it idempotent.
    spark = (SparkSession.builder.master("local[2,4]").appName("leveret-crash")
             .config("spark.driver.memory", "512m")
             # a short-lived JVM: the C1 compiler alone halves the start-up time
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    _say("session ready")

    @F.udf("binary")
    def slow(body: bytes) -> bytes:
        time.sleep(0.005)  # ~0.5 s per partition of 100 rows
        return body

    queries = []
    for spec in sys.argv[3:]:
        kind, source, target = spec.split(":")
        reader = (spark.readStream.format("leveret").option("url", url)
                  .option("partitionSize", 100))
        if kind == "stream":
            reader = (reader.option("stream", source).option("startingOffset", "first")
                      .option("maxOffsetsPerTrigger", 200))
        else:
            reader = (reader.option("queue", source).option("group", "crash")
                      .option("maxMessagesPerTrigger", 200).option("leaseTtlMs", 3000))
        queries.append(
            reader.load().select(slow("body").alias("body"))
            .writeStream.format("leveret").option("url", url).option("routingKey", target)
            .option("confirmWindow", 20)  # publish as rows come, not all at the end
            .option("checkpointLocation", os.path.join(checkpoints, f"{kind}-{source}"))
            .trigger(availableNow=True).start())
    _say("queries started")
    for query in queries:
        query.awaitTermination()
    _say("queries done")
    spark.stop()


if __name__ == "__main__":
    main()
