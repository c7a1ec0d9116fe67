"""What every Spark-backed command does around its job: a session, and a progress bar."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def spark_session(console: Console, master: str, **options: Any) -> Iterator[SparkSession]:
    """A session for one command (`build_session` options): one already running in this
    process (a notebook, a test) is reused and left running; one started here is stopped
    at the end."""
    from pyspark.sql import SparkSession

    from ballast.pipeline.session import build_session

    owned = SparkSession.getActiveSession() is None
    with console.status(f"starting Spark ({master})"):
        spark = build_session(master, **options)
    try:
        yield spark
    finally:
        if owned:
            spark.stop()


def stage_progress(console: Console) -> Progress:
    """A transient bar for a job's stages: description, done/total, elapsed time."""
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
