"""ONE SparkSession for the whole test run (local[2], 1 GB, UI off, bound to 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from ballast.pipeline.session import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(
        "local[2]", app_name="ballast-tests", driver_memory="1g", shuffle_partitions=4
    )
    yield session
    session.stop()
