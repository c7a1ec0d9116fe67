"""The load-history layout, defined once for the sink (cluster side) and the pipeline.

The leader appends every load report it receives as one JSON object per line, the
`LoadReport.to_dict()` form plus an optional `state` ("active" | "draining" | "drained"):

    {root}/date=YYYY-MM-DD/hour=HH/{writer}.jsonl        (UTC)

One file per writer and hour: a new leader (or a second sink) writes its own file instead
of interleaving lines with another process, and hourly files keep every file small
enough to split, list and upload cheaply. A crash can leave at most one truncated line at
the end of a file; the pipeline quarantines it.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from types import TracebackType
from typing import IO, Any

from ballast.model import BrokerMode, LoadReport, ModelError

# The glob (relative to the root) that matches every history file, and nothing else.
HISTORY_GLOB = "date=*/hour=*/*.jsonl"
_WRITER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


def history_dir(root: str, timestamp: float) -> str:
    """The hour directory `{root}/date=YYYY-MM-DD/hour=HH` holding reports of `timestamp`."""
    when = datetime.fromtimestamp(timestamp, tz=UTC)
    return f"{root.rstrip('/')}/date={when:%Y-%m-%d}/hour={when:%H}"


def history_path(root: str, timestamp: float, writer: str = "history") -> str:
    """The file a writer appends a report taken at `timestamp` (epoch seconds) to.

    `root` may be a local directory or any fsspec URL (`s3://bucket/prefix`).
    """
    if not _WRITER.match(writer):
        raise ModelError(
            f"history writer name {writer!r}: use 1-128 letters, digits, '_', '.', '-'"
        )
    return f"{history_dir(root, timestamp)}/{writer}.jsonl"


def history_line(report: LoadReport, state: BrokerMode | str | None = None) -> str:
    """One history line: the report's JSON form, plus the broker state when known."""
    data: dict[str, Any] = report.to_dict()
    if state is not None:
        data["state"] = BrokerMode(state).value
    return json.dumps(data, separators=(",", ":"))


class HistoryWriter:
    """Appends load reports to the hourly history files of one writer (local directory).

    Each line is flushed as it is written, so a crash loses at most the line being
    written (which the pipeline then quarantines as truncated). Use as a context manager
    or call `close()`.
    """

    def __init__(self, root: str | os.PathLike[str], writer: str = "history") -> None:
        self.root = os.fspath(root)
        self.writer = writer
        history_path(self.root, 0.0, writer)  # validate the writer name up front
        self._path: str | None = None
        self._file: IO[str] | None = None

    def append(self, report: LoadReport, state: BrokerMode | str | None = None) -> str:
        """Append one report; return the path of the file it went to."""
        path = history_path(self.root, report.timestamp, self.writer)
        if path != self._path:
            self.close()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across appends
            self._path = path
        assert self._file is not None
        self._file.write(history_line(report, state) + "\n")
        self._file.flush()
        return path

    def close(self) -> None:
        """Close the current file (the next `append` reopens as needed)."""
        if self._file is not None:
            self._file.close()
        self._file = None
        self._path = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
