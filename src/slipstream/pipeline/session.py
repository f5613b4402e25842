"""A Spark session set up for slipstream's jobs, in local mode, on a cluster, or under spark-submit.

Local mode (``local[*]``) is the default. ``--master URL`` runs the same jobs on a cluster. Under
``spark-submit`` (which starts this process with a Py4J gateway and its own ``--master``) no master
is forced, so what spark-submit was given wins. The UI is off unless asked for (it costs start-up
time and a port), shuffles use few partitions (telemetry aggregates are small), and times are UTC.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .source import register

DEFAULT_MASTER = "local[*]"


def under_spark_submit() -> bool:
    """True when spark-submit launched this Python process (it passes the gateway in the environment)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(
    master: str | None = None,
    *,
    app_name: str = "slipstream-pipeline",
    ui: bool = False,
    shuffle_partitions: int = 4,
    conf: dict[str, str] | None = None,
) -> Any:
    """Get or create the Spark session, with the ``slipstream`` data source registered."""
    from pyspark.sql import SparkSession

    if not under_spark_submit():  # Python workers (and data source planning) use this interpreter's packages
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        if (master or DEFAULT_MASTER).startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode binds nothing else
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    elif not under_spark_submit():
        builder = builder.master(DEFAULT_MASTER)
    settings = {
        "spark.ui.enabled": str(ui).lower(),
        "spark.ui.showConsoleProgress": "false",  # the report prints its own progress
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.python.filterPushdown.enabled": "true",  # the slipstream source applies filters itself
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.driver.extraJavaOptions": "-Dlog4j2.level=warn",
    }
    src = os.environ.get("PYTHONPATH")
    if src:  # executors of a cluster import slipstream from where this process does
        settings["spark.executorEnv.PYTHONPATH"] = src
    settings.update(conf or {})
    for key, value in settings.items():
        if under_spark_submit() and key.startswith("spark.pyspark."):
            continue
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if id(spark) not in _REGISTERED:  # getOrCreate hands back the same session: register once
        register(spark)
        _REGISTERED.add(id(spark))
    return spark


_REGISTERED: set[int] = set()
