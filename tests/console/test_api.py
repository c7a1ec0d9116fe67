"""The console's HTTP admin API over a live in-process cluster (MemoryStore; the store is not
the point here — `test_live.py` follows a real etcd)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from ballast.clock import SystemClock
from ballast.cluster import AdminClient, LocalCluster
from ballast.config import parse_config
from ballast.console import LiveCluster, create_app
from ballast.metadata.memory import MemoryStore
from ballast.model import TopicName
from ballast.registry.service import SchemaStore
from ballast.wire.auth import Permission, TokenAuthority
from tests.cluster.helpers import FAST_REBALANCING, fast_config, wait_settled, wait_until
from tests.console.helpers import serving

pytestmark = pytest.mark.timeout(60)


@dataclass
class Setup:
    cluster: LocalCluster
    admin: AdminClient
    live: LiveCluster
    client: httpx.AsyncClient


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    clock = SystemClock()
    config = fast_config()
    async with MemoryStore(clock) as store, LocalCluster(store, clock, config) as cluster:
        for broker in ("b1", "b2"):
            await cluster.start_broker(broker)
        # The leader does not rebalance by itself; plans use fast rules (no cooldown, no age).
        admin = AdminClient(store, clock, fast_config(rebalancing=FAST_REBALANCING))
        await admin.create_topics(f"/default/t{i:02d}" for i in range(20))
        await wait_settled(admin, 20, timeout=10)
        async with LiveCluster(store, clock, admin=admin, frame_seconds=0.05) as live:
            transport = httpx.ASGITransport(app=create_app(live))
            async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
                yield Setup(cluster, admin, live, c)


async def test_cluster_brokers_and_topics_are_paged_and_filtered(setup: Setup) -> None:
    c = setup.client
    summary = (await c.get("/api/summary")).json()
    assert summary["brokers"] == 2 and summary["topics"] == 20
    assert summary["leader"] in ("b1", "b2")

    page = (await c.get("/api/brokers", params={"limit": 1})).json()
    assert page["total"] == 2 and [r["broker_id"] for r in page["items"]] == ["b1"]
    row = page["items"][0]
    assert row["state"] == "active" and row["topics"] == 10 and row["cpu_percent"] is not None

    topics = (await c.get("/api/topics", params={"offset": 5, "limit": 5})).json()
    assert topics["total"] == 20
    assert [t["topic"] for t in topics["items"]] == [f"/default/t{i:02d}" for i in range(5, 10)]
    found = (await c.get("/api/topics", params={"q": "t1"})).json()
    assert found["total"] == 10
    owned = (await c.get("/api/topics", params={"owner": "b2", "state": "assigned"})).json()
    assert owned["total"] == 10 and {t["owner"] for t in owned["items"]} == {"b2"}
    waiting = (await c.get("/api/topics", params={"state": "unassigned"})).json()
    assert waiting["total"] == 0  # all placed
    in_ns = (await c.get("/api/topics", params={"namespace": "default", "limit": 1})).json()
    assert in_ns["total"] == 20 and len(in_ns["items"]) == 1


async def test_topic_page_gives_every_brokers_verdict(setup: Setup) -> None:
    detail = (await setup.client.get("/api/topics/default/t03")).json()
    expected = (await setup.admin.describe("/default/t03")).to_dict()
    assert detail["owner"] == expected["owner"]
    assert detail["placement"]["rejected"] == {detail["owner"]: expected["placement"]["rejected"][
        detail["owner"]
    ]}  # fmt: skip
    assert set(detail["placement"]["scores"]) == {"b1", "b2"}


async def test_errors_are_json_with_the_clis_messages(setup: Setup) -> None:
    c = setup.client
    missing = await c.get("/api/topics/default/nope")
    assert missing.status_code == 400
    assert missing.json() == {
        "error": "topic /default/nope does not exist (create it with `topics create`)"
    }
    drain = await c.post("/api/brokers/b9/drain")
    assert drain.status_code == 400
    assert drain.json()["error"] == "broker 'b9' is not registered (registered: b1, b2)"
    exists = await c.post("/api/topics", json={"topics": ["/default/t01"]})
    assert exists.json() == {"error": "topic /default/t01 already exists"}
    bad = await c.get("/api/topics", params={"limit": 0})
    assert bad.status_code == 422 and "limit" in bad.json()["error"]
    plan = await c.post("/api/rebalance/apply", json={"nothing": 1})
    assert plan.json() == {"error": "plan: expected a JSON object with a 'moves' list"}
    openapi = (await c.get("/openapi.json")).json()
    assert "/api/rebalance/plan" in openapi["paths"] and "/api/history" in openapi["paths"]


async def test_drain_from_the_api_completes_and_activate_restores(setup: Setup) -> None:
    c = setup.client
    assert (await c.post("/api/brokers/b2/drain")).json() == {
        "broker_id": "b2",
        "state": "draining",
    }

    async def drained() -> bool:
        row = (await c.get("/api/brokers/b2")).json()
        return bool(row["state"] == "drained" and row["topics"] == 0)

    await wait_until(drained, 10, "b2 drained, seen through the API")
    assert (await c.post("/api/brokers/b2/activate")).json()["state"] == "active"


async def test_rebalance_plan_then_apply_the_reviewed_plan(setup: Setup) -> None:
    c = setup.client
    await setup.cluster.start_broker("b3")  # empty: the plan moves topics onto it
    await wait_until(lambda: _has_brokers(c, 3), 5, "b3 in the console's view", interval=0.05)
    plan = (await c.post("/api/rebalance/plan")).json()
    assert plan["dry_run"] is True and plan["moves"]
    assert plan["after"]["cv"] < plan["before"]["cv"]
    assert all(m["to_broker"] == "b3" for m in plan["moves"])
    applied = (await c.post("/api/rebalance/apply", json=plan)).json()
    assert [o["reason"] for o in applied["outcomes"]] == ["started"] * len(plan["moves"])

    async def moved() -> bool:
        row = (await c.get("/api/brokers/b3")).json()
        return bool(row["topics"] == len(plan["moves"]))

    await wait_until(moved, 10, "the planned topics owned by b3")
    history = (await c.get("/api/history", params={"broker": "b3", "reason": "admin"})).json()
    assert history["total"] == len(plan["moves"])
    assert {m["topic"] for m in history["items"]} == {m["topic"] for m in plan["moves"]}
    span = (await c.get("/api/balance/history")).json()
    assert span["samples"] and span["moves_total"] == len(plan["moves"])


async def _has_brokers(c: httpx.AsyncClient, n: int) -> bool:
    return bool((await c.get("/api/summary")).json()["brokers"] == n)


async def test_events_stream_pushes_a_frame_when_a_broker_joins(setup: Setup) -> None:
    async with (
        serving(setup.admin) as (url, live),
        httpx.AsyncClient() as client,
        client.stream("GET", f"{url}/api/events") as stream,
    ):
        lines = stream.aiter_lines()
        first = await _next_frame(lines)
        assert first["changed"] == ["all"] and first["summary"]["brokers"] == 2
        assert live.subscribers == 1
        await setup.cluster.start_broker("b4")
        async with asyncio.timeout(5):
            while True:
                frame = await _next_frame(lines)
                if frame["summary"]["brokers"] == 3:
                    break
        assert "brokers" in frame["changed"]


async def _next_frame(lines: AsyncIterator[str]) -> dict[str, Any]:
    async for line in lines:
        if line.startswith("data: "):
            data: dict[str, Any] = json.loads(line[len("data: ") :])
            return data
    raise AssertionError("the event stream ended")


async def test_prometheus_http_sd_lists_brokers_with_metrics(setup: Setup) -> None:
    groups = (await setup.client.get("/api/prometheus/targets")).json()
    assert groups == []  # the test brokers run without metrics endpoints


USER_V1 = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
USER_V2 = {
    "type": "object",
    "properties": {"id": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["id"],
}


async def test_schemas_subjects_versions_and_topic_binding(setup: Setup) -> None:
    c = setup.client
    assert (await c.get("/api/schemas")).json() == []
    schemas = SchemaStore(setup.admin.store, setup.admin.clock)
    v1, _ = await schemas.register("users", "json_schema", json.dumps(USER_V1).encode())
    v2, _ = await schemas.register(
        "users", "json_schema", json.dumps(USER_V2).encode(), created_by="ops", tags=("pii",)
    )
    await schemas.configure_topic(TopicName.parse("/default/t01"), "users", "enforce", True)

    listed = (await c.get("/api/schemas")).json()
    assert [(r["subject"], r["schema_id"], r["compatibility"]) for r in listed] == [
        ("users", v1.schema_id, "backward")
    ]
    assert listed[0]["versions"] == [1, 2] and listed[0]["schema_type"] == "json_schema"

    subject = (await c.get("/api/schemas/users")).json()
    assert subject["compatibility"] == "backward" and subject["schema_id"] == v1.schema_id
    assert [v["version"] for v in subject["versions"]] == [1, 2]
    assert subject["versions"][1]["fingerprint"] == v2.fingerprint
    assert subject["versions"][1]["tags"] == ["pii"] and "definition" not in subject["versions"][1]

    got = (await c.get("/api/schemas/users/versions/2")).json()
    assert got["version"] == 2 and got["created_by"] == "ops"
    assert json.loads(got["definition"]) == USER_V2

    bound = (await c.get("/api/topics/default/t01/schema")).json()
    assert bound["topic"] == "/default/t01" and bound["subject"] == "users"
    assert bound["validation_policy"] == "enforce" and bound["enable_payload_validation"]
    assert bound["schema_id"] == v1.schema_id
    openapi = (await c.get("/openapi.json")).json()
    assert "/api/schemas/{subject}/versions/{version}" in openapi["paths"]
    assert openapi["paths"]["/api/schemas"]["get"]["tags"] == ["schemas"]


async def test_schema_errors_are_json_404s_naming_what_is_missing(setup: Setup) -> None:
    c = setup.client
    schemas = SchemaStore(setup.admin.store, setup.admin.clock)
    await schemas.register("users", "json_schema", json.dumps(USER_V1).encode())
    unknown = await c.get("/api/schemas/orders")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "subject 'orders' does not exist"}
    missing = await c.get("/api/schemas/users/versions/7")
    assert missing.status_code == 404
    assert missing.json() == {"error": "subject 'users' has no version 7"}
    assert (await c.get("/api/schemas/orders/versions/1")).status_code == 404
    unbound = await c.get("/api/topics/default/t02/schema")
    assert unbound.status_code == 404
    assert unbound.json() == {
        "error": "topic /default/t02 has no schema (ballast admin topics set-schema)"
    }
    bad_subject = await c.get("/api/schemas/-users")
    assert bad_subject.status_code == 400 and "[subject-name]" in bad_subject.json()["error"]
    bad_topic = await c.get("/api/topics/default/-t/schema")
    assert bad_topic.status_code == 400
    assert bad_topic.json()["error"].startswith("invalid topic name '/default/-t'")
    zero = await c.get("/api/schemas/users/versions/0")
    assert zero.status_code == 422 and "version" in zero.json()["error"]


async def test_with_jwt_auth_the_api_needs_an_admin_token() -> None:
    settings = parse_config({"auth": {"mode": "jwt", "secret": "s" * 32}}).auth
    authority = TokenAuthority(settings)
    admin_token = authority.issue("ops", {"*": [Permission.ADMIN]})
    reader = authority.issue("app", {"orders": [Permission.CONSUME]})
    clock = SystemClock()
    async with MemoryStore(clock) as store:
        admin = AdminClient(store, clock)
        async with LiveCluster(store, clock, admin=admin) as live:
            app = create_app(live, authority=authority)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as c:
                none = await c.get("/api/summary")
                assert none.status_code == 401
                assert none.json()["error"].startswith("UNAUTHENTICATED: no token")
                denied = await c.get("/api/summary", headers={"Authorization": f"Bearer {reader}"})
                assert denied.status_code == 403
                assert denied.json() == {
                    "error": "PERMISSION_DENIED: token of 'app' lacks the 'admin' permission "
                    "on namespace '*'"
                }
                ok = await c.get("/api/summary", headers={"Authorization": f"Bearer {admin_token}"})
                assert ok.status_code == 200 and ok.json()["brokers"] == 0
                for path in ("/api/schemas", "/api/schemas/users", "/api/topics/a/b/schema"):
                    assert (await c.get(path)).status_code == 401
                    reading = await c.get(path, headers={"Authorization": f"Bearer {reader}"})
                    assert reading.status_code == 403
                listed = await c.get(
                    "/api/schemas", headers={"Authorization": f"Bearer {admin_token}"}
                )
                assert listed.status_code == 200 and listed.json() == []
                page = await c.get("/")  # the page itself is public; it asks for a token
                assert page.status_code == 200 and "Ballast console" in page.text
