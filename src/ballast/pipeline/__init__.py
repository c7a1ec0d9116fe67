"""The load-history pipeline on Apache Spark: history layout, synthetic histories, and the
`analyze` job (windows, strategy comparison, rebalance plan, report).

`history` (the sink's file layout) and `generate` do not need Spark; the other modules do.
The pipeline imports the decision core (`ballast.balance`), `ballast.model` and
`ballast.config`, never the cluster or CLI layers.
"""

from ballast.pipeline.history import HISTORY_GLOB, HistoryWriter, history_line, history_path

__all__ = ["HISTORY_GLOB", "HistoryWriter", "history_line", "history_path"]
