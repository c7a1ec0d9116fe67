"""The load-history pipeline on Apache Spark: synthetic histories and the `analyze` job
(windows, strategy comparison, rebalance plan, report).

The history's file layout is `ballast.load_history` (below both the cluster's sink and
this package, so the live leader never imports the pipeline). `generate` does not need
Spark; the other modules do. The pipeline imports the decision core (`ballast.balance`),
`ballast.model` and `ballast.config`, never the cluster or CLI layers.
"""
