"""The gateway's half of the unreachable-owner rule (`ballast.leader.reachability`).

The gateway registers itself under a lease of its own (``/reachability/gateways/{id}``)
and, every `check_interval_seconds`, looks at its connection to each registered broker
(the gRPC channel, whose keepalive drops a silent connection within
`connections.keepalive_seconds + keepalive_timeout_seconds`): a broker whose channel has
not been READY for `report_after_seconds` is reported (``/reachability/reports/{id}/{b}``
with the instant it was first seen not ready, under the same lease); the report is
withdrawn once the broker was READY again for `clear_after_seconds`. If the gateway loses
its lease (it cannot reach etcd), its reports go with it and it registers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from ballast.config import ReachabilitySettings
from ballast.gateway.brokers import BrokerLinks
from ballast.gateway.routes import OwnerTable
from ballast.metadata import Lease, MetadataError, MetadataStore, keys

log = logging.getLogger(__name__)

__all__ = ["ReachabilityReporter", "gateway_id"]


def gateway_id(advertise: str) -> str:
    """A gateway's id from its advertised address (``10.0.0.5:6600`` → ``gw-10.0.0.5-6600``)."""
    cleaned = "".join(c if c.isalnum() or c in "-_." else "-" for c in advertise)
    return f"gw-{cleaned.strip('-')}"[:128]


class ReachabilityReporter:
    """Registers the gateway and reports the brokers it cannot reach (module docstring)."""

    def __init__(
        self,
        store: MetadataStore,
        links: BrokerLinks,
        table: OwnerTable,
        settings: ReachabilitySettings,
        ttl: float,
        gateway: str,
        url: str,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.links = links
        self.table = table
        self.settings = settings
        self.ttl = ttl
        self.gateway = gateway
        self.url = url
        self.wall = wall
        self.monotonic = monotonic
        self.reported: dict[str, float] = {}  # broker -> since (what the store holds)
        self._down_since: dict[str, float] = {}  # broker -> first seen not ready (wall)
        self._up_since: dict[str, float] = {}  # broker -> ready again since (monotonic)
        self._last_look: float | None = None  # monotonic time of the previous `observe`

    async def run(self) -> None:
        """Register, report, and register again whenever the lease is lost."""
        while True:
            try:
                lease = await self.store.grant_lease(self.ttl)
                await self.store.put(
                    keys.gateway_registration(self.gateway), {"url": self.url}, lease=lease.id
                )
                self.reported.clear()  # the old lease's reports are gone with it
                keeper = asyncio.create_task(lease.keep_alive_forever(lost_after=lease.ttl))
                try:
                    await self._report(lease, keeper)
                except asyncio.CancelledError:
                    # Stopping: the registration and the reports go now, not at the TTL.
                    with contextlib.suppress(MetadataError, TimeoutError):
                        async with asyncio.timeout(1.0):
                            await self.store.revoke_lease(lease.id)
                    raise
                finally:
                    keeper.cancel()
                    with contextlib.suppress(BaseException):
                        await keeper
            except asyncio.CancelledError:
                raise
            except MetadataError as exc:
                log.warning("gateway: reachability reports: %s; registering again", exc)
            await asyncio.sleep(self.settings.check_interval_seconds)

    async def _report(self, lease: Lease, keeper: asyncio.Task[None]) -> None:
        while not keeper.done():
            for broker, since in self.observe().items():
                if since is None:
                    await self.store.delete(keys.unreachable_report(self.gateway, broker))
                    self.reported.pop(broker, None)
                    log.info("gateway: broker %s is reachable again", broker)
                else:
                    await self.store.put(
                        keys.unreachable_report(self.gateway, broker),
                        {"since": since},
                        lease=lease.id,
                    )
                    self.reported[broker] = since
                    log.warning(
                        "gateway: broker %s unreachable for %.1f s; reported",
                        broker,
                        self.wall() - since,
                    )
            await asyncio.sleep(self.settings.check_interval_seconds)

    def observe(self) -> dict[str, float | None]:
        """One look at every registered broker's channel: the reports to write (broker →
        unreachable since) and to withdraw (broker → None)."""
        now, mono = self.wall(), self.monotonic()
        settings = self.settings
        expected = settings.check_interval_seconds + settings.report_after_seconds / 2
        late = self._last_look is not None and mono - self._last_look > expected
        self._last_look = mono
        if late:
            # This gateway itself stalled (its process starved of CPU): what its channels
            # did meanwhile says nothing about the brokers. Start looking afresh.
            self._down_since.clear()
        changes: dict[str, float | None] = {}
        brokers = dict(self.table.urls)
        for broker, url in brokers.items():
            state = self.links.channel(url).get_state(try_to_connect=True)
            if state is grpc.ChannelConnectivity.READY:
                self._down_since.pop(broker, None)
                up = self._up_since.setdefault(broker, mono)
                if broker in self.reported and mono - up >= self.settings.clear_after_seconds:
                    changes[broker] = None
                continue
            self._up_since.pop(broker, None)
            down = self._down_since.setdefault(broker, now)
            if broker not in self.reported and now - down >= self.settings.report_after_seconds:
                changes[broker] = down
        for broker in list(self.reported):
            if broker not in brokers:  # it left: its report means nothing any more
                changes[broker] = None
        for table in (self._down_since, self._up_since):
            for broker in [b for b in table if b not in brokers]:
                del table[broker]
        return changes
