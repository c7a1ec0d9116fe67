"""The control plane's records now live in `ballast.leader.records`; re-exported."""

from ballast.leader.records import (
    Registration,
    TopicMeta,
    assignment_value,
    claim_ops,
    owner_value,
    parse_assignment_value,
    parse_owner_value,
    parse_topic_meta_key,
    release_ops,
)

__all__ = [
    "Registration",
    "TopicMeta",
    "assignment_value",
    "claim_ops",
    "owner_value",
    "parse_assignment_value",
    "parse_owner_value",
    "parse_topic_meta_key",
    "release_ops",
]
