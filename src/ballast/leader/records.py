"""Where `cluster/broker.py` and `simulate/engine.py` still import the record vocabulary
from; it lives in `ballast.metadata.records`. This module goes once those two import it
from there (they are being reworked on another branch)."""

from ballast.metadata.records import (
    Registration,
    TopicMeta,
    claim_ops,
    parse_assignment_value,
    release_ops,
)

__all__ = ["Registration", "TopicMeta", "claim_ops", "parse_assignment_value", "release_ops"]
