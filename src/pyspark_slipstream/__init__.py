"""``format("slipstream")`` in every Spark session, found by PySpark itself.

PySpark 4 looks, once per Spark driver, for installed top-level modules named ``pyspark_*`` that
expose ``DefaultSource`` (a :class:`pyspark.sql.datasource.DataSource`) and registers each under its
``name()``: ``slipstream`` here. So after ``pip install 'slipstream[pipeline]'`` a session built with
a plain ``SparkSession.builder.getOrCreate()`` reads and writes ``format("slipstream")`` without
:func:`slipstream.pipeline.source.register`. The lookup runs in the Python that Spark starts for its
workers (``PYSPARK_PYTHON``, else ``python3`` on ``PATH``), so slipstream must be installed there.

This module imports pyspark and pyarrow; ``import slipstream`` never imports it.
"""

from __future__ import annotations

from slipstream.pipeline.source import SlipstreamDataSource

DefaultSource = SlipstreamDataSource
"""What PySpark's data source lookup registers (as ``slipstream``)."""

__all__ = ["DefaultSource"]
