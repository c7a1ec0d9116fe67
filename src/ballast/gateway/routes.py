"""Where calls go: the gateway's watch-fed picture of topic owners and broker addresses.

`OwnerTable` follows the metadata store (registrations and ownership records) and wakes
whoever waits for a change (`changed`), so a held call moves on the moment a topic has a
new owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ballast.metadata import MetadataError, MetadataStore, WatchEvent, keys
from ballast.metadata.records import RecordKind, Registration, classify, parse_owner_value
from ballast.model import ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Route:
    """A broker a call goes to."""

    broker_id: str | None
    url: str


class OwnerTable:
    """Registrations and ownership records, from one listing of ``/cluster/`` and its watch."""

    def __init__(
        self,
        store: MetadataStore,
        on_gone: Callable[[str], None] | None = None,
        on_new: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.on_gone = on_gone  # called with a broker_url whose registration went away
        self.on_new = on_new  # and with one that registered
        self.urls: dict[str, str] = {}  # broker id -> broker_url (registered brokers)
        self.owners: dict[str, str] = {}  # topic -> broker id (its ownership record)
        self.ready = asyncio.Event()
        self.version = 0  # counts changes: a waiter misses none made since it looked
        self._changed = asyncio.Event()

    def owner(self, topic: str) -> Route | None:
        """The registered broker the topic's ownership record names, if any (the same
        answer as `Directory.owner`, from the watch instead of two reads)."""
        broker = self.owners.get(topic)
        url = self.urls.get(broker) if broker is not None else None
        return Route(broker, url) if url else None

    def registered(self, url: str) -> str | None:
        """The id of the registered broker listening on `url`, if any."""
        for broker, known in self.urls.items():
            if known == url:
                return broker
        return None

    def any_broker(self) -> Route | None:
        """Some registered broker (for calls that name neither broker nor owned topic)."""
        for broker in sorted(self.urls):
            return Route(broker, self.urls[broker])
        return None

    async def changed(self, timeout: float, since: int) -> None:
        """Wait until something changes after `version` was `since` (or `timeout`): a
        change made while the caller was busy (e.g. asking the old owner) ends it at once."""
        if self.version != since:
            return
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)

    def _notify(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _apply(self, key: str, value: Any, deleted: bool) -> None:
        try:
            kind, broker, topic = classify(key)
        except ValueError:
            return  # not a key of ours (the leader counts bad records)
        if kind is RecordKind.REGISTRATION and broker is not None:
            before = self.urls.get(broker)
            _put_or_drop(self.urls, broker, None if deleted else _broker_url(value))
            after = self.urls.get(broker)
            if before is not None and before != after and self.on_gone:
                self.on_gone(before)
            if after is not None and before != after and self.on_new:
                self.on_new(after)
        elif kind is RecordKind.OWNER and topic is not None:
            _put_or_drop(self.owners, topic, None if deleted else _owner(value))
        else:
            return
        self._notify()

    async def run(self) -> None:
        """List, then follow the watch; re-list after a compaction or a store failure."""
        while True:
            try:
                listing = await self.store.get_prefix(keys.CLUSTER_PREFIX)
                self.urls.clear()
                self.owners.clear()
                for kv in listing.items:
                    self._apply(kv.key, kv.value, False)
                self._notify()
                self.ready.set()
                watch = self.store.watch_prefix(keys.CLUSTER_PREFIX, listing.revision + 1)
                async for event in watch:
                    if not self._event(event):
                        break
            except asyncio.CancelledError:
                raise
            except MetadataError as exc:
                log.warning("gateway: metadata store: %s; re-listing in 1 s", exc)
            await asyncio.sleep(1.0)

    def _event(self, event: WatchEvent) -> bool:
        if event.kind == "compacted":
            return False
        if event.kind in ("put", "delete"):
            self._apply(event.key, event.value, event.kind == "delete")
        return True


def _put_or_drop(table: dict[str, str], key: str, value: str | None) -> None:
    if value:
        table[key] = value
    else:
        table.pop(key, None)


# A record that does not decode routes nowhere (the leader counts it as rejected).
def _broker_url(value: Any) -> str | None:
    try:
        return Registration.from_dict(value).broker_url
    except ModelError:
        return None


def _owner(value: Any) -> str | None:
    try:
        return parse_owner_value(value)
    except ModelError:
        return None
