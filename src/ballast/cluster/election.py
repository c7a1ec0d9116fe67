"""Leader election: a create-if-absent transaction on ``/cluster/leader`` bound to a lease.

- Campaign: ``txn(compare: leader key absent, success: put {broker_id, since} with lease)``.
  Exactly one campaigner wins; the create revision of the key identifies the term.
- Followers watch the key and campaign again on its delete event: no polling delay, a new
  leader within one round trip of the old lease expiring.
- The leader keeps its lease alive and watches the key too; losing the lease, or seeing
  the key deleted or replaced, ends the term.
- Fencing: `Term.fence` is a compare on the key's create revision. Every load-manager write
  carries it, so a deposed leader that has not noticed yet cannot change anything: its
  write fails the compare (Danube's get-then-put election lets two leaders write).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from ballast.aio import first_completed
from ballast.clock import Clock
from ballast.cluster.metrics import ClusterMetrics
from ballast.cluster.service import Service, keep_alive, watching
from ballast.metadata import (
    Compare,
    Delete,
    KeyValue,
    Lease,
    MetadataError,
    MetadataStore,
    Put,
    keys,
)
from ballast.metadata.records import leader_fence, leader_value
from ballast.model import BrokerId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Term:
    """One leadership term; `revision` (the leader key's create revision) is its token."""

    leader: BrokerId
    revision: int
    since: float
    ended: asyncio.Event = field(default_factory=asyncio.Event, compare=False, repr=False)

    @property
    def fence(self) -> Compare:
        """The compare every write of this term carries."""
        return leader_fence(self.revision)

    @property
    def active(self) -> bool:
        return not self.ended.is_set()


class FenceLost(Exception):
    """A write of `term` was refused because the term is over."""

    def __init__(self, term: Term) -> None:
        super().__init__(f"leadership term {term.revision} of {term.leader} is over")
        self.term = term


class LeaderElection(Service):
    """Campaigns for `broker_id` until the context exits (then resigns if leading)."""

    def __init__(
        self,
        store: MetadataStore,
        clock: Clock,
        broker_id: BrokerId,
        ttl: float,
        *,
        metrics: ClusterMetrics | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__()
        self.name = f"election/{broker_id}"
        self.store = store
        self.clock = clock
        self.broker_id = broker_id
        self.ttl = ttl
        self.metrics = metrics
        self.retry_delay = retry_delay
        self.term: Term | None = None
        self.leader: BrokerId | None = None  # the last known leader (ours or another's)
        self._lease: Lease | None = None
        self._changed = asyncio.Condition()

    @property
    def is_leader(self) -> bool:
        return self.term is not None and self.term.active

    async def elected(self) -> Term:
        """Wait until this broker leads; return the term (check `term.ended` afterwards)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.is_leader)
            assert self.term is not None
            return self.term

    async def verify(self, term: Term) -> bool:
        """Re-read the leader key; end `term` if it no longer holds. True if it holds."""
        kv = await self.store.get(keys.LEADER)
        holds = kv is not None and kv.create_revision == term.revision
        if not holds:
            await self._end(term, "the leader key changed")
        return holds

    async def _start(self) -> None:
        self.spawn(self._campaign_loop(), "campaign")

    async def _stop(self) -> None:
        term, lease = self.term, self._lease
        try:
            if term is not None and term.active:
                # Resign: delete our key (only ours) so a follower takes over at once.
                await self.store.txn([term.fence], [Delete(keys.LEADER)])
            if lease is not None:
                await self.store.revoke_lease(lease.id)
        except MetadataError as exc:
            log.warning("%s: resign failed (the lease will expire): %s", self.name, exc)
        finally:
            if term is not None:
                await self._end(term, "stopped")

    async def _set(self, term: Term | None) -> None:
        async with self._changed:
            self.term = term
            if self.metrics is not None:
                self.metrics.leader.set(1 if term is not None and term.active else 0)
            self._changed.notify_all()

    async def _end(self, term: Term, why: str) -> None:
        if term.active:
            log.info("%s: term %d ended: %s", self.name, term.revision, why)
            term.ended.set()
        if self.term is term:
            await self._set(None)

    async def _campaign_loop(self) -> None:
        while True:
            failed = False
            try:
                await self._campaign_once()
            except* MetadataError as group:  # the store is unreachable: campaign again later
                log.warning("%s: campaign failed, retrying: %s", self.name, group.exceptions[0])
                failed = True
            if failed:
                await self.clock.sleep(self.retry_delay)

    async def _campaign_once(self) -> None:
        lease = await self.store.grant_lease(self.ttl)
        self._lease = lease
        try:
            now = self.clock.now()
            result = await self.store.txn(
                [Compare.absent(keys.LEADER)],
                [Put(keys.LEADER, leader_value(self.broker_id, now), lease.id)],
            )
            if result.succeeded:
                term = Term(self.broker_id, result.revision, now)
                self.leader = self.broker_id
                log.info("%s: elected leader (term %d)", self.name, term.revision)
                await self._set(term)
                try:
                    await self._hold(term, lease)
                finally:
                    await self._end(term, "lease or key lost")
                return
            await self.store.revoke_lease(lease.id)
            self._lease = None
            await self._follow()
        finally:
            if self._lease is lease and not self.abandoned:
                self._lease = None
                try:
                    await self.store.revoke_lease(lease.id)
                except MetadataError as exc:
                    log.debug("%s: revoking lease %d failed: %s", self.name, lease.id, exc)

    async def _hold(self, term: Term, lease: Lease) -> None:
        """Lead until the lease is lost or the key changes (then return)."""
        await first_completed(
            self.name,
            {
                "lease": keep_alive(lease, self.name),
                "watch": self._watch_own_key(term),
                "ended": term.ended.wait(),
            },
        )

    async def _watch_own_key(self, term: Term) -> None:
        """Return as soon as the leader key changes after our create (it is not ours)."""
        start = term.revision + 1
        while True:
            async with watching(self.store, keys.LEADER, start) as watch:
                async for event in watch:
                    if event.key != keys.LEADER:
                        continue
                    if event.kind == "compacted":
                        break
                    return  # a put, delete or bad value after our create
            # Compacted, or the store ended the watch: check the key, watch from now on.
            kv, revision = await self._read_leader()
            if kv is None or kv.create_revision != term.revision:
                return
            start = revision + 1
            await self.clock.sleep(self.retry_delay)

    async def _read_leader(self) -> tuple[KeyValue | None, int]:
        """The leader key and the revision it was read at (watch from revision + 1)."""
        listing = await self.store.get_prefix(keys.LEADER)
        kv = next((item for item in listing.items if item.key == keys.LEADER), None)
        return kv, listing.revision

    async def _follow(self) -> None:
        """Wait until the leader key is deleted (then the caller campaigns again)."""
        while True:
            kv, revision = await self._read_leader()
            if kv is None:
                return
            value = kv.value if isinstance(kv.value, dict) else {}
            leader = value.get("broker_id")
            if leader != self.leader:
                log.info("%s: following leader %s", self.name, leader)
            self.leader = leader if isinstance(leader, str) else None
            async with watching(self.store, keys.LEADER, revision + 1) as watch:
                async for event in watch:
                    if event.key != keys.LEADER:
                        continue
                    if event.kind == "delete":
                        self.leader = None
                        return
                    if event.kind == "compacted":
                        break  # re-read the key and watch again
                    if event.kind == "put" and isinstance(event.value, dict):
                        leader = event.value.get("broker_id")
                        self.leader = leader if isinstance(leader, str) else None
                else:
                    # The watch ended without a delete (the store closed it): re-read.
                    await self.clock.sleep(self.retry_delay)
