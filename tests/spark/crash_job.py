"""A streaming job run as its own process by test_spark_crash.py (like spark-submit):

    python crash_job.py URL stream|queue SOURCE TARGET CHECKPOINT

It builds a local[2] SparkSession, reads SOURCE (a leveret stream, or a queue through
leases) with format("leveret"), slows each row down a little so that a batch takes
about a second, and writes the bodies through the leveret sink to the queue TARGET,
with a checkpoint and trigger(availableNow=True). The test SIGKILLs it mid-batch and
starts it again on the same checkpoint. Exits 0 once everything available is written.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    url, kind, source, target, checkpoint = sys.argv[1:6]
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from leveret.spark import register

    spark = (SparkSession.builder.master("local[2]").appName(f"leveret-crash-{kind}")
             .config("spark.driver.memory", "512m")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.driver.host", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    reader = spark.readStream.format("leveret").option("url", url).option("partitionSize", 100)
    if kind == "stream":
        reader = (reader.option("stream", source).option("startingOffset", "first")
                  .option("maxOffsetsPerTrigger", 200))
    else:
        reader = (reader.option("queue", source).option("group", "crash")
                  .option("maxMessagesPerTrigger", 200).option("leaseTtlMs", 3000))

    @F.udf("binary")
    def slow(body: bytes) -> bytes:
        time.sleep(0.004)  # ~0.4 s per partition of 100 rows
        return body

    query = (reader.load().select(slow("body").alias("body"))
             .writeStream.format("leveret").option("url", url).option("routingKey", target)
             .option("confirmWindow", 20)  # publish as rows come, not at the end
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
