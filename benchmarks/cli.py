"""What every benchmark's command line shares: `--quick` and the one JSON document it prints.

`--quick` runs the same code paths at small sizes, in seconds (``tests/test_benchmarks.py``
runs every benchmark that way): it swaps the defaults of the benchmark's own options for
its quick ones, so an option given explicitly still wins (``--quick --topics 8``).

    parser = argparse.ArgumentParser(description=__doc__.split("\\n")[0])
    parser.add_argument("--topics", type=int, default=100)
    args = parse_args(parser, quick={"topics": 4})
    ...
    emit(report)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["emit", "parse_args"]


def parse_args(
    parser: argparse.ArgumentParser,
    quick: Mapping[str, Any],
    argv: Sequence[str] | None = None,
) -> argparse.Namespace:
    """Parse `argv` with a `--quick` flag whose defaults are `quick` (option dest → value)."""
    options = vars(parser.parse_known_args([])[0])
    unknown = [dest for dest in quick if dest not in options]
    if unknown:  # a typo would quietly run the full size
        raise ValueError(f"quick defaults for options the parser does not have: {unknown}")
    shown = ", ".join(f"{dest}={value}" for dest, value in quick.items())
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"small sizes, seconds of wall time, the same code paths ({shown})",
    )
    if parser.parse_known_args(argv)[0].quick:
        parser.set_defaults(**quick)
    return parser.parse_args(argv)


def emit(report: Mapping[str, Any]) -> None:
    """Print the benchmark's result: one JSON document on stdout (progress goes to stderr)."""
    print(json.dumps(report, indent=2), flush=True)
