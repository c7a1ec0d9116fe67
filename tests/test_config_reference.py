"""The committed configuration reference is exactly what the models generate."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from ballast.config import BallastConfig
from ballast.config_reference import PAGE, REGENERATE, render, rows, sections

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_page_is_the_generated_one() -> None:
    committed = (ROOT / PAGE).read_text()
    assert committed == render(), (
        f"{PAGE} differs from what src/ballast/config.py generates: run `{REGENERATE}` "
        f"(python -m ballast.config_reference > {PAGE}) and commit the result"
    )


def test_every_key_has_a_description() -> None:
    missing = [
        f"{path}.{name}"
        for path, model, _ in sections(BallastConfig)
        for name, info in model.model_fields.items()
        if not (isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel))
        and not info.description
    ]
    assert not missing, f"add Field(description=...) to: {', '.join(missing)}"


def test_every_section_has_a_docstring() -> None:
    # A section's page heading is explained by its class docstring.
    bare = [path for path, model, _ in sections(BallastConfig) if not model.__doc__]
    assert not bare, f"give these section classes a docstring: {', '.join(bare)}"


def test_the_page_lists_every_key_with_its_bounds() -> None:
    page = render()
    for path, model, _ in sections(BallastConfig):
        assert f"`{path}`" in page
        for row in rows(model):
            assert f"| `{row.key}` |" in page
    assert "| `max_request_bytes` | int | `8388608` (8 MiB) |" in page
    assert "Allowed: ≥ 4194304, ≤ 67108864." in page
    assert "| `ack` | one of `durable`, `local` | `durable` |" in page
    assert "| `aggressive` | 0.2 | 120 | 20 |" in page
