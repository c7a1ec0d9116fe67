"""The web console in a real headless Chromium (Debian's, driven by Playwright) against a
running cluster on a real etcd: the live view follows a broker joining and a topic moving,
a dry-run plan shows and applies, a drain started from the page completes; with auth on,
the page asks for a token and then goes live.

One browser and one cluster serve the whole module (the tests run in order and build on
each other's cluster); each page is saved as a screenshot (see SHOTS).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.config import parse_config
from ballast.metadata.etcd import EtcdStore
from ballast.wire.auth import Permission, TokenAuthority
from tests.cluster.conftest import wipe
from tests.cluster.helpers import FAST_REBALANCING, fast_config, wait_settled
from tests.console.helpers import serving
from tests.etcd_fixtures import EtcdServer

CHROMIUM = Path("/usr/bin/chromium")
# `make screenshots` saves the pages under docs/console/ (the console page's pictures); a plain
# test run keeps the tree clean and saves them in the temporary directory.
SHOTS = Path(
    os.environ.get("BALLAST_CONSOLE_SCREENSHOTS")
    or Path(tempfile.gettempdir()) / "ballast-console-screenshots"
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 10_000

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(60),
]


@dataclass
class Console:
    url: str
    cluster: LocalCluster
    admin: AdminClient
    page: Any  # playwright.async_api.Page


async def launch_chromium(user_data_dir: str) -> tuple[Any, Any]:
    """Playwright and a persistent Chromium context on a fresh profile."""
    from playwright.async_api import async_playwright

    playwright = await async_playwright().start()
    context = await playwright.chromium.launch_persistent_context(
        user_data_dir,
        executable_path=str(CHROMIUM),
        headless=True,
        args=CHROMIUM_ARGS,
        viewport={"width": 1280, "height": 760},
    )
    return playwright, context


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def console(etcd_server: EtcdServer) -> AsyncIterator[Console]:
    clock = SystemClock()
    profile = tempfile.mkdtemp(prefix="ballast-chromium-")
    async with EtcdStore(etcd_server.client_url) as store:
        await wipe(store)
        config = fast_config()
        try:
            async with LocalCluster(store, clock, config) as cluster:
                for broker in ("b1", "b2"):
                    await cluster.start_broker(broker)
                admin = AdminClient(store, clock, fast_config(rebalancing=FAST_REBALANCING))
                await admin.create_topics(f"/default/t{i:02d}" for i in range(12))
                await wait_settled(admin, 12, timeout=15)
                async with serving(admin) as (url, _):
                    playwright, context = await launch_chromium(profile)
                    try:
                        page = context.pages[0] if context.pages else await context.new_page()
                        page.set_default_timeout(TIMEOUT_MS)
                        yield Console(url, cluster, admin, page)
                    finally:
                        await context.close()
                        await playwright.stop()
        finally:
            shutil.rmtree(profile, ignore_errors=True)
            await wipe(store)


async def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"))


async def confirm(page: Any) -> None:
    await page.locator("#confirm[open]").wait_for()
    await page.click("#confirm-ok")


async def test_live_view_shows_a_broker_joining(console: Console) -> None:
    page = console.page
    await page.goto(console.url + "/")
    await page.locator('#brokers tr[data-broker="b2"]').wait_for()
    await page.wait_for_function(
        "() => document.querySelector('#live-text').textContent === 'live'"
    )
    await console.cluster.start_broker("b3")
    # No reload: the server-sent event brings the new broker onto the page.
    row = page.locator('#brokers tr[data-broker="b3"]')
    await row.wait_for()
    assert await row.get_attribute("data-state") == "active"
    await page.wait_for_function(
        "() => document.querySelector('#card-brokers .v').textContent === '3'"
    )
    await shot(page, "cluster")


async def test_topic_page_follows_a_move(console: Console) -> None:
    page = console.page
    await page.goto(console.url + "/#/topics")
    await page.fill("#topic-q", "t0")
    await page.locator('#topics tr[data-topic="/default/t05"]').wait_for()
    await shot(page, "topics")
    await page.click('#topics tr[data-topic="/default/t05"] a')
    owner = page.locator("#topic-owner-now")
    await page.locator("#verdicts tbody tr").first.wait_for()
    before = await owner.inner_text()
    assert before in ("b1", "b2")
    await page.click("#topic-unload")
    await confirm(page)
    # The owner seals it, the leader places it elsewhere; the page follows by itself.
    await page.wait_for_function(
        "b => !['-', b].includes(document.querySelector('#topic-owner-now').textContent)",
        arg=before,
    )
    verdicts = await page.locator("#verdicts tbody tr").count()
    assert verdicts == 3  # one verdict per broker
    await shot(page, "topic")


async def test_rebalance_dry_run_shows_and_applies(console: Console) -> None:
    page = console.page
    await page.goto(console.url + "/#/rebalance")
    await page.click("#plan-run")
    await page.locator("#plan tbody tr").first.wait_for()
    summary = await page.locator("#plan-summary").inner_text()
    assert "move(s)" in summary and "→" in summary
    planned = await page.locator("#plan tbody tr").count()
    assert planned > 0
    outcomes = page.locator("#plan td.outcome")
    assert set(await outcomes.all_inner_texts()) == {"planned"}
    await page.click("#plan-apply")
    await confirm(page)
    await page.wait_for_function(
        "() => [...document.querySelectorAll('#plan td.outcome')]"
        ".every(td => td.textContent === 'started')"
    )
    await shot(page, "rebalance")
    await wait_settled(console.admin, 12, timeout=15)


async def test_drain_started_from_the_page_completes(console: Console) -> None:
    page = console.page
    await page.goto(console.url + "/")
    await page.click('#brokers button.drain[data-b="b3"]')
    await confirm(page)
    await page.locator('#drain-progress[data-state="drained"]').wait_for()
    row = page.locator('#brokers tr[data-broker="b3"]')
    await page.wait_for_function(
        "() => document.querySelector('#brokers tr[data-broker=\"b3\"]')"
        ".dataset.state === 'drained'"
    )
    assert await row.locator("td.topics").inner_text() == "0"
    await shot(page, "drain")


async def test_balance_page_charts_the_moves(console: Console) -> None:
    page = console.page
    await page.goto(console.url + "/#/balance")
    await page.locator("#balance-chart path.cv").wait_for(state="attached")
    await page.locator("#history tbody tr").first.wait_for()  # the table loads after the chart
    assert await page.locator("#balance-chart line.move").count() >= 1
    await shot(page, "balance")


async def test_with_auth_the_page_asks_for_a_token_then_goes_live(console: Console) -> None:
    authority = TokenAuthority(parse_config({"auth": {"mode": "jwt", "secret": "k" * 32}}).auth)
    token = authority.issue("ops", {"*": [Permission.ADMIN]})
    async with serving(console.admin, authority=authority) as (url, _):
        page = await console.page.context.new_page()
        try:
            await page.goto(url + "/")
            await page.locator("#login[open]").wait_for()
            assert (await page.locator("#login-error").inner_text()).startswith(
                "UNAUTHENTICATED: no token"
            )
            await page.fill("#login-token", token)
            await page.click("#login button")
            await page.locator('#brokers tr[data-broker="b1"]').wait_for()
            await page.wait_for_function(
                "() => document.querySelector('#live-text').textContent === 'live'"
            )
        finally:
            await page.close()
