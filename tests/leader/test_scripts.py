"""Scripted interaction tests of the leader state machine (``testdata/*.txt``).

No clock, no store, no asyncio: events in, effects out, compared as text. Run with
``REWRITE=1`` to regenerate the expected outputs after a deliberate change, then review
the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.leader.script import run_file

TESTDATA = Path(__file__).parent / "testdata"


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("*.txt")), ids=lambda p: p.stem)
def test_script(path: Path) -> None:
    expected, actual = run_file(path)
    assert actual == expected
