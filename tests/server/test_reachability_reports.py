"""A gateway's reachability reports (`ballast.gateway.reachability`) and the keepalive of
its TCP links (`ballast.keepalive`): what it reports, when, and when it withdraws."""

from __future__ import annotations

import socket
from typing import Any

import grpc

from ballast.config import ReachabilitySettings
from ballast.gateway.reachability import ReachabilityReporter, gateway_id
from ballast.keepalive import set_tcp_keepalive


class FakeChannel:
    def __init__(self) -> None:
        self.state = grpc.ChannelConnectivity.READY

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self.state


class FakeLinks:
    def __init__(self) -> None:
        self.channels: dict[str, FakeChannel] = {}

    def channel(self, url: str) -> FakeChannel:
        return self.channels.setdefault(url, FakeChannel())


class FakeTable:
    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls


def reporter(wall: list[float], urls: dict[str, str]) -> tuple[ReachabilityReporter, FakeLinks]:
    """A reporter whose clocks are both `wall[0]` (checks every 0.5 s by default)."""
    links = FakeLinks()
    settings = ReachabilitySettings(report_after_seconds=1.0, clear_after_seconds=0.0)
    links_: Any = links
    table: Any = FakeTable(urls)
    store: Any = None
    r = ReachabilityReporter(
        store, links_, table, settings, 5.0, "gw-1", "gw:1", lambda: wall[0], lambda: wall[0]
    )
    return r, links


def test_a_broker_not_ready_for_report_after_seconds_is_reported_then_withdrawn() -> None:
    wall = [100.0]
    r, links = reporter(wall, {"b1": "h1:1", "b2": "h2:1"})
    assert r.observe() == {}
    links.channel("h2:1").state = grpc.ChannelConnectivity.CONNECTING
    assert r.observe() == {}  # not ready since 100.0: not for long enough yet
    wall[0] = 100.5
    assert r.observe() == {}
    wall[0] = 101.2
    assert r.observe() == {"b2": 100.0}  # reported with the instant it was first seen
    r.reported["b2"] = 100.0  # what `_report` does once written
    assert r.observe() == {}
    links.channel("h2:1").state = grpc.ChannelConnectivity.READY
    assert r.observe() == {"b2": None}  # withdrawn (clear_after_seconds 0 here)


def test_what_the_channels_did_while_the_gateway_itself_stalled_is_no_evidence() -> None:
    """A gateway starved of CPU for longer than it takes to report found every channel
    not ready at once; its first look after the stall starts afresh instead."""
    wall = [100.0]
    r, links = reporter(wall, {"b1": "h1:1"})
    links.channel("h1:1").state = grpc.ChannelConnectivity.CONNECTING
    assert r.observe() == {}
    wall[0] = 102.0  # the next look, 2 s late: the gateway stalled
    assert r.observe() == {}  # not reported: not ready "since 100.0" is not known
    wall[0] = 102.5
    assert r.observe() == {}
    wall[0] = 103.0
    assert r.observe() == {"b1": 102.0}  # not ready for 1 s of looking: reported


def test_a_report_of_a_broker_that_left_is_withdrawn() -> None:
    wall = [0.0]
    urls = {"b2": "h2:1"}
    r, _ = reporter(wall, urls)
    r.reported["b2"] = 0.0
    urls.clear()
    assert r.observe() == {"b2": None}


def test_gateway_ids_are_valid_key_segments() -> None:
    assert gateway_id("10.0.0.5:6600") == "gw-10.0.0.5-6600"
    assert gateway_id("[::1]:6600") == "gw-1--6600"


def test_a_tcp_link_gives_up_on_silence() -> None:
    with socket.socket() as sock:
        set_tcp_keepalive(sock, 2.0, 3.0)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 2
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 5000
