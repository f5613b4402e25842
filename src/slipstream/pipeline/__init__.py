"""The data pipeline on Apache Spark (PySpark): report jobs, the ``slipstream`` data source and sink.

Needs the ``pipeline`` extra (pyspark, pyarrow, matplotlib) and Java 17. This package's ``__init__``
imports nothing heavy, so ``slipstream pipeline --help`` works without them; the modules do:
``session`` (a configured SparkSession), ``source`` (``format("slipstream")``), ``jobs`` (the tables),
``report`` (HTML and plots), ``run`` (the command and the spark-submit entry point), ``demo``.
Recordings are read only through :mod:`slipstream.telemetry`. May import ``network``, ``telemetry``
and the floors below; only ``cli`` imports it.
"""
