"""The core's rules on Spark columns: the engine operations (`SPARK_OPS`) and the name
rules of `ballast.model` as Java regular expressions.

Nothing here restates a rule: formulas come from `ballast.model`, `ballast.balance.scoring`
and `ballast.balance.imbalance`, and are applied to columns through `SPARK_OPS`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from ballast.model import BROKER_ID_PATTERN, TOPIC_NAME_PATTERN, Ops


def _column(value: Any) -> Column:
    return value if isinstance(value, Column) else F.lit(value)


def _zero(value: Any) -> Column:
    # An integer zero sums longs (counts), a float zero doubles.
    if isinstance(value, bool) or not isinstance(value, int):
        return F.lit(float(value))
    return F.lit(value).cast("long")


SPARK_OPS = Ops(
    where=lambda condition, if_true, if_false: F.when(condition, if_true).otherwise(if_false),
    maximum=lambda a, b: F.greatest(_column(a), _column(b)),
    total=lambda items, term, zero: F.aggregate(items, _zero(zero), lambda acc, t: acc + term(t)),
    field=lambda item, name: item[name],
)


def java_full_match(pattern: str) -> str:
    """A model pattern as a regex that must match the whole string (`rlike` finds), in
    the syntax Java and RE2 (Arrow's `match_substring_regex`) share."""
    return rf"\A(?:{pattern})\z"


BROKER_ID_REGEX = java_full_match(BROKER_ID_PATTERN)
TOPIC_NAME_REGEX = java_full_match(TOPIC_NAME_PATTERN)


def is_broker_id(column: Column) -> Column:
    """`ballast.model.is_broker_id` on a string column (null stays null)."""
    return column.rlike(BROKER_ID_REGEX)


def is_topic_name(column: Column) -> Column:
    """`ballast.model.is_topic_name` on a string column (null stays null)."""
    return column.rlike(TOPIC_NAME_REGEX)
