"""The cluster view now lives in `ballast.leader.view` (below the shell); re-exported."""

from ballast.leader.view import BadRecord, Change, ClusterView, Pending, RecordKind, classify

__all__ = ["BadRecord", "Change", "ClusterView", "Pending", "RecordKind", "classify"]
