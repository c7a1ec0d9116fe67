"""The storage engine's counters (`StorageStats`) as Prometheus series.

The storage layer has no metrics dependency; this collector reads its plain counters at
scrape time: ``ballast_storage_{name}_total`` for every counter, and
``ballast_storage_opens_total{source}`` for how topics resumed, and per served reliable
topic ``ballast_storage_topic_objects{topic}`` and ``ballast_storage_topic_bytes{topic}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ballast.storage import StorageStats

__all__ = ["StorageCollector"]

_HELP = {
    "upload_failures": "Failed attempts to write an object or commit its descriptor (retried)",
    "ack_timeouts": "Appends not committed to object storage within ack_timeout (not acked)",
    "reader_retries": "Subscription readers restarted after a storage error",
    "ack_ranges_dropped": "Acked offsets above a cursor left out of its stored value "
    "(cursor_ack_ranges; delivered again after a move)",
    "objects_uploaded": "Objects committed to object storage",
    "descriptor_commits": "Metadata transactions committing object descriptors",
    "objects_merged": "Small committed objects rewritten into bigger ones",
}


class StorageCollector(Collector):
    """Exports one broker's `StorageStats`, and what each reliable topic it serves keeps in
    the object store (`stored`: topic name, objects, bytes)."""

    def __init__(
        self,
        stats: StorageStats,
        stored: Callable[[], Iterable[tuple[str, int, int]]] = tuple,
    ) -> None:
        self.stats = stats
        self.stored = stored

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        objects = GaugeMetricFamily(
            "ballast_storage_topic_objects", "Objects a served reliable topic keeps in the "
            "object store", labels=["topic"],
        )  # fmt: skip
        size = GaugeMetricFamily(
            "ballast_storage_topic_bytes", "Bytes a served reliable topic keeps in the "
            "object store", labels=["topic"],
        )  # fmt: skip
        for topic, count, nbytes in self.stored():
            objects.add_metric([topic], count)
            size.add_metric([topic], nbytes)
        yield objects
        yield size
        for name, value in self.stats.snapshot().items():
            if name == "opens_by_source":
                family = CounterMetricFamily(
                    "ballast_storage_opens", "Reliable topics opened, by where offsets resumed",
                    labels=["source"],
                )  # fmt: skip
                assert isinstance(value, dict)
                for source, count in sorted(value.items()):
                    family.add_metric([source], count)
                yield family
            elif isinstance(value, int):
                help_text = _HELP.get(name, f"Storage engine counter {name.replace('_', ' ')}")
                yield CounterMetricFamily(f"ballast_storage_{name}", help_text, value=value)
