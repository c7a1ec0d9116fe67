"""The console's HTTP admin API and web pages (FastAPI), over `AdminClient`.

`create_app` receives its collaborators — the `LiveCluster` (the one watch and its
frames) and, when ``auth.mode: jwt``, a `TokenAuthority` — and builds the application;
nothing is global. Reads are served from the live view's latest frame; writes go through
the same `AdminClient` operations as ``ballast admin …``, with the same messages: an
`AdminError` is answered ``400 {"error": "<the CLI's message>"}``, an unknown broker,
schema subject or version, or a topic without a schema ``404``, an unreachable store
``503``, a refused token ``401``/``403`` (``UNAUTHENTICATED: …``/``PERMISSION_DENIED: …``).
The schema registry is read through the same `SchemaStore` as ``ballast admin schemas``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from ballast.cluster.admin import AdminError
from ballast.cluster.namespaces import NamespaceAdmin
from ballast.console.live import BalanceSample, LiveCluster
from ballast.console.targets import prometheus_targets
from ballast.metadata import MetadataError, MetadataUnavailableError
from ballast.model import InvalidTopicName, Move, TopicName
from ballast.registry.service import SchemaStore, subject_rows, topic_binding, version_dict
from ballast.schemas import SchemaError, validate_subject
from ballast.wire.auth import AuthError, Permission, TokenAuthority

MAX_PAGE = 1000
KEEPALIVE_SECONDS = 15.0

Offset = Annotated[int, Query(ge=0, description="First item of the page.")]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="Items per page.")]


class Refused(Exception):
    """A request refused before any operation: `status` and the message to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _page(items: Sequence[Any], offset: int, limit: int) -> tuple[int, Sequence[Any]]:
    return len(items), items[offset : offset + limit]


def _paged(total: int, offset: int, limit: int, items: list[Any]) -> dict[str, Any]:
    return {"total": total, "offset": offset, "limit": limit, "items": items}


def filter_moves(
    moves: Sequence[Move],
    *,
    topic: str | None = None,
    broker: str | None = None,
    reason: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list[Move]:
    """The moves matching every given filter (topic: substring; reason: substring)."""
    out = []
    for m in moves:
        if since is not None and m.timestamp < since:
            continue
        if until is not None and m.timestamp > until:
            continue
        if topic and topic not in m.topic:
            continue
        if broker and broker not in (m.from_broker, m.to_broker):
            continue
        if reason and reason.lower() not in m.reason.lower():
            continue
        out.append(m)
    return out


def bucket_samples(samples: Sequence[BalanceSample], points: int) -> list[dict[str, float]]:
    """At most `points` samples: equal time buckets (mean CV and mean, min of min, max of
    max), so a long history stays one cheap chart."""
    if len(samples) <= points:
        return [s.to_dict() for s in samples]
    start, end = samples[0].timestamp, samples[-1].timestamp
    width = (end - start) / points or 1.0
    buckets: dict[int, list[BalanceSample]] = {}
    for s in samples:
        buckets.setdefault(min(points - 1, int((s.timestamp - start) / width)), []).append(s)
    out = []
    for _, group in sorted(buckets.items()):
        n = len(group)
        out.append(
            {
                "timestamp": group[-1].timestamp,
                "cv": sum(s.cv for s in group) / n,
                "mean": sum(s.mean for s in group) / n,
                "std": sum(s.std for s in group) / n,
                "min": min(s.min for s in group),
                "max": max(s.max for s in group),
            }
        )
    return out


def create_app(
    live: LiveCluster,
    *,
    authority: TokenAuthority | None = None,
    store_label: str = "the metadata store",
    stopping: asyncio.Event | None = None,
) -> FastAPI:
    """The console application over `live`; with `authority`, every API call needs a token
    granting ``admin`` (header ``Authorization: Bearer …``; the event stream also takes
    ``?token=``, since browsers cannot set headers on it). Setting `stopping` ends the
    open event streams (before a server shuts down)."""
    admin = live.admin
    schemas = SchemaStore(admin.store, admin.clock)
    stopping = stopping if stopping is not None else asyncio.Event()

    def require_admin(request: Request) -> None:
        if authority is None:
            return
        header = request.headers.get("authorization")
        token = request.query_params.get("token")
        metadata = [("authorization", header)] if header else []
        if not metadata and token:
            metadata = [("authorization", f"Bearer {token}")]
        try:
            authority.authorize(metadata, "*", (Permission.ADMIN,))
        except AuthError as exc:
            status = 401 if exc.code.name == "UNAUTHENTICATED" else 403
            raise Refused(status, f"{exc.code.name}: {exc.message}") from None

    api = APIRouter(prefix="/api", dependencies=[Depends(require_admin)])

    # -- cluster ---------------------------------------------------------------------------

    @api.get("/summary", tags=["cluster"], summary="Brokers, topics, leader and balance")
    async def summary() -> dict[str, Any]:
        return (await live.current_frame()).summary()

    @api.get("/leader", tags=["cluster"], summary="The current leader (null during an election)")
    async def leader() -> dict[str, Any] | None:
        return (await live.current_frame()).leader

    @api.get("/balance", tags=["cluster"], summary="CV, mean, std, min, max, classification")
    async def balance() -> dict[str, Any]:
        return (await live.current_frame()).balance

    @api.get(
        "/balance/history",
        tags=["cluster"],
        summary="Balance over time (as posted by the leader) and the moves in the same window",
    )
    async def balance_history(
        since: float | None = None,
        until: float | None = None,
        points: Annotated[int, Query(ge=2, le=5000)] = 400,
        max_moves: Annotated[int, Query(ge=0, le=20_000)] = 2000,
    ) -> dict[str, Any]:
        frame = await live.current_frame()
        samples = [
            s
            for s in live.samples
            if (since is None or s.timestamp >= since) and (until is None or s.timestamp <= until)
        ]
        moves = filter_moves(frame.moves, since=since, until=until)
        return {
            "samples": bucket_samples(samples, points),
            "moves": [m.to_dict() for m in moves[-max_moves:] if max_moves],
            "moves_total": len(moves),
        }

    @api.get("/history", tags=["cluster"], summary="Persisted moves, newest first, paged")
    async def history(
        offset: Offset = 0,
        limit: Limit = 100,
        topic: Annotated[str | None, Query(description="Topic name contains.")] = None,
        broker: Annotated[str | None, Query(description="Moved from or to.")] = None,
        reason: Annotated[str | None, Query(description="Reason contains.")] = None,
        since: Annotated[float | None, Query(description="Epoch seconds.")] = None,
        until: Annotated[float | None, Query(description="Epoch seconds.")] = None,
    ) -> dict[str, Any]:
        frame = await live.current_frame()
        if any(v is not None for v in (topic, broker, reason, since, until)):
            moves: Sequence[Move] = filter_moves(
                frame.moves, topic=topic, broker=broker, reason=reason, since=since, until=until
            )
        else:
            moves = frame.moves
        total = len(moves)
        newest = moves[::-1][offset : offset + limit] if offset < total else []
        return _paged(total, offset, limit, [m.to_dict() for m in newest])

    # -- brokers ---------------------------------------------------------------------------

    @api.get("/brokers", tags=["brokers"], summary="Brokers with state, score and load, paged")
    async def brokers(
        offset: Offset = 0,
        limit: Limit = 100,
        q: Annotated[str | None, Query(description="Broker id contains.")] = None,
        state: Annotated[str | None, Query(description="active, draining, drained, gone")] = None,
        sort: Annotated[str, Query(pattern="^(id|score|topics|cpu|memory|throughput)$")] = "id",
    ) -> dict[str, Any]:
        frame = await live.current_frame()
        rows = [
            r
            for r in frame.brokers
            if (not q or q in r.info.broker_id) and (not state or r.info.state == state)
        ]
        if sort != "id":
            attr = {
                "score": lambda r: r.info.score,
                "topics": lambda r: r.info.topics,
                "cpu": lambda r: r.cpu_percent,
                "memory": lambda r: r.memory_percent,
                "throughput": lambda r: r.throughput_mbps,
            }[sort]
            rows.sort(key=lambda r: (attr(r) is not None, attr(r) or 0), reverse=True)
        total, page = _page(rows, offset, limit)
        return _paged(total, offset, limit, [r.to_dict() for r in page])

    @api.get("/brokers/{broker_id}", tags=["brokers"], summary="One broker")
    async def broker(broker_id: str) -> dict[str, Any]:
        frame = await live.current_frame()
        for row in frame.brokers:
            if row.info.broker_id == broker_id:
                return row.to_dict()
        known = ", ".join(r.info.broker_id for r in frame.brokers[:20]) or "none"
        raise Refused(404, f"broker {broker_id!r} is not registered (registered: {known})")

    @api.post("/brokers/{broker_id}/drain", tags=["brokers"], summary="Drain a broker")
    async def drain(broker_id: str) -> dict[str, Any]:
        await admin.drain(broker_id)
        live.touch()
        return {"broker_id": broker_id, "state": "draining"}

    @api.post("/brokers/{broker_id}/activate", tags=["brokers"], summary="Activate a broker")
    async def activate(broker_id: str) -> dict[str, Any]:
        await admin.activate(broker_id)
        live.touch()
        return {"broker_id": broker_id, "state": "active"}

    # -- topics ----------------------------------------------------------------------------

    @api.get("/topics", tags=["topics"], summary="Topics with owner, state and age, paged")
    async def topics(
        offset: Offset = 0,
        limit: Limit = 100,
        q: Annotated[str | None, Query(description="Topic name contains.")] = None,
        owner: Annotated[str | None, Query(description="Owned by this broker.")] = None,
        state: Annotated[
            str | None, Query(description="assigned, unassigned, moving, sealing")
        ] = None,
        namespace: Annotated[str | None, Query(description="In this namespace.")] = None,
    ) -> dict[str, Any]:
        frame = await live.current_frame()
        view = live.view
        now = live.clock.now()
        names: Sequence[str] = sorted(view.topics_of(owner)) if owner else frame.topics
        if namespace:
            prefix = f"/{namespace}/"
            names = [t for t in names if t.startswith(prefix)]
        if q:
            names = [t for t in names if q in t]
        if state == "assigned":  # owned; only the page's rows are built
            names = [t for t in names if t in view.owners]
        elif state:  # the few topics without an owner: unassigned, moving or sealing
            names = [
                t
                for t in names
                if t not in view.owners and admin.topic_info(view, t, now).state == state
            ]
        total, page_names = _page(names, offset, limit)
        items = [admin.topic_info(view, t, now).to_dict() for t in page_names]
        return _paged(total, offset, limit, items)

    @api.post("/topics", tags=["topics"], summary="Create topics (the leader places each)")
    async def create_topics(
        topics: Annotated[list[str], Body(description="Topic names, /namespace/topic.")],
        hint: Annotated[str | None, Body(description="Preferred broker.")] = None,
        reliable: Annotated[bool, Body(description="Reliable (stored) topics.")] = False,
    ) -> dict[str, Any]:
        meta = {"dispatch_strategy": "reliable" if reliable else "non_reliable"}
        created = [await admin.create_topic(t, hint=hint, meta=meta) for t in topics]
        return {"created": created}

    @api.get(
        "/topics/{namespace}/{topic}",
        tags=["topics"],
        summary="A topic: owner, state, age, and every broker's verdict (why here)",
    )
    async def describe(namespace: str, topic: str) -> dict[str, Any]:
        return (await admin.describe(f"/{namespace}/{topic}")).to_dict()

    @api.post(
        "/topics/{namespace}/{topic}/unload",
        tags=["topics"],
        summary="Unload a topic from its owner (the leader places it elsewhere)",
    )
    async def unload(namespace: str, topic: str) -> dict[str, Any]:
        name = f"/{namespace}/{topic}"
        owner = await admin.unload_topic(name)
        return {"topic": name, "from_broker": owner}

    # -- namespaces --------------------------------------------------------------------------

    @api.get("/namespaces", tags=["namespaces"], summary="Namespaces with their bundles")
    async def namespaces() -> list[dict[str, Any]]:
        return await NamespaceAdmin(admin).list_namespaces()

    @api.get("/namespaces/{namespace}/bundles", tags=["namespaces"], summary="Bundles")
    async def bundles(namespace: str) -> dict[str, Any]:
        return (await NamespaceAdmin(admin).bundles(namespace)).to_dict()

    # -- schemas (read-only; `ballast admin schemas` writes) -------------------------------------

    @api.get(
        "/schemas",
        tags=["schemas"],
        summary="Every subject: id, compatibility mode, versions, latest type",
    )
    async def schema_subjects() -> list[dict[str, Any]]:
        return await subject_rows(schemas)

    @api.get("/schemas/{subject}", tags=["schemas"], summary="A subject: its mode and versions")
    async def schema_subject(subject: str) -> dict[str, Any]:
        found = await schemas.subject(subject)
        if found is None:
            raise Refused(404, f"subject {subject!r} does not exist")
        return {
            **found[0].to_dict(),
            "versions": [version_dict(v) for v in await schemas.versions(subject)],
        }

    @api.get(
        "/schemas/{subject}/versions/{version}",
        tags=["schemas"],
        summary="One version of a subject with its definition",
    )
    async def schema_version(subject: str, version: Annotated[int, Path(ge=1)]) -> dict[str, Any]:
        found = await schemas.version(validate_subject(subject), version)
        if found is None:
            raise Refused(404, f"subject {subject!r} has no version {version}")
        return version_dict(found, definition=True)

    @api.get(
        "/topics/{namespace}/{topic}/schema",
        tags=["schemas"],
        summary="A topic's schema binding: subject, validation policy, schema id",
    )
    async def topic_schema(namespace: str, topic: str) -> dict[str, Any]:
        try:
            name = TopicName.parse(f"/{namespace}/{topic}")
        except InvalidTopicName as exc:
            raise Refused(400, str(exc)) from None
        found = await topic_binding(schemas, name)
        if found is None:
            raise Refused(404, f"topic {name} has no schema (ballast admin topics set-schema)")
        return found

    # -- rebalancing -----------------------------------------------------------------------

    @api.post(
        "/rebalance/plan",
        tags=["rebalance"],
        summary="A dry-run plan: moves, predicted CV before and after (nothing is written)",
    )
    async def rebalance_plan(
        max_moves: Annotated[int | None, Query(ge=0)] = None,
    ) -> dict[str, Any]:
        return (await admin.rebalance(dry_run=True, max_moves=max_moves)).to_dict()

    @api.post(
        "/rebalance/apply",
        tags=["rebalance"],
        summary="Start the moves of a reviewed plan (the /rebalance/plan answer)",
    )
    async def rebalance_apply(plan: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        outcomes = await admin.apply_plan(plan)
        return {"outcomes": [o.to_dict() for o in outcomes]}

    # -- live updates and discovery -----------------------------------------------------------

    @api.get(
        "/events",
        tags=["live"],
        summary="Server-sent events: a summary and what changed, at most every frame",
        response_class=StreamingResponse,
    )
    async def events(request: Request) -> StreamingResponse:
        frame = await live.current_frame()

        async def stream() -> AsyncIterator[str]:
            async with live.subscribe() as queue:
                yield _sse("frame", {"summary": frame.summary(), "changed": ["all"]})
                stop = asyncio.ensure_future(stopping.wait())
                getter: asyncio.Future[Any] | None = None
                try:
                    while not stopping.is_set():
                        getter = asyncio.ensure_future(queue.get())
                        done, _ = await asyncio.wait(
                            {getter, stop},
                            timeout=KEEPALIVE_SECONDS,
                            return_when=asyncio.FIRST_COMPLETED,
                        )
                        if getter in done:
                            yield _sse("frame", getter.result().to_dict())
                            continue
                        getter.cancel()
                        if stop.done() or await request.is_disconnected():
                            return
                        yield ": keep-alive\n\n"
                finally:
                    stop.cancel()
                    if getter is not None:
                        getter.cancel()

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    @api.get(
        "/prometheus/targets",
        tags=["live"],
        summary="Prometheus HTTP service discovery: every broker's metrics endpoint",
    )
    async def targets() -> list[dict[str, Any]]:
        await live.current_frame()
        return prometheus_targets(live.view)

    # -- the application ---------------------------------------------------------------------

    app = FastAPI(
        title="Ballast console",
        version="1",
        description=(
            "The HTTP admin API of a Ballast cluster: the operations of `ballast admin`, "
            "over the same AdminClient, with the same messages."
        ),
    )
    app.include_router(api)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(AdminError)
    async def admin_error(_: Request, exc: AdminError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(SchemaError)
    async def schema_error(_: Request, exc: SchemaError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=400)

    @app.exception_handler(MetadataError)
    async def store_error(_: Request, exc: MetadataError) -> JSONResponse:
        message = str(exc)
        if isinstance(exc, MetadataUnavailableError):
            message = f"cannot reach the metadata store at {store_label}: {exc}"
        return JSONResponse({"error": message}, status_code=503)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
            for e in exc.errors()
        )
        return JSONResponse({"error": problems}, status_code=422)

    static = resources.files("ballast.console") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(str(static / "index.html"))

    return app


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


__all__ = ["bucket_samples", "create_app", "filter_moves"]
