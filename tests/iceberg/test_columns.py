"""`iceberg.columns.once_per_context`: a builder's columns made once per Spark context and
arguments, and usable in any frame of that context."""

from __future__ import annotations

import pytest

from iceberg.columns import once_per_context


@pytest.mark.spark
def test_a_builder_runs_once_per_arguments_and_its_columns_serve_every_frame(spark):
    from pyspark.sql import functions as F

    calls = []

    @once_per_context
    def plus(n: int):
        calls.append(n)
        return (F.col("id") + n).alias("x")

    assert plus(1) is plus(1)
    assert plus(2) is not plus(1)
    assert calls == [1, 2]
    for session in (spark, spark.newSession()):
        assert [r.x for r in session.range(3).select(plus(1)).collect()] == [1, 2, 3]
        assert [r.x for r in session.range(2).select(plus(2)).collect()] == [2, 3]
    assert calls == [1, 2]
