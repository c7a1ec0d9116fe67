"""`ballast produce` and `ballast consume`: the published `danube-client` against a cluster.

Both print a progress line on stderr (totals and rates, once a second) and a summary at the
end (JSON with ``--json``). ``--service-url`` is any broker (default: a local one); the
client looks the topic up and follows it when it moves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import typer

from ballast.cli.client_security import (
    ClientSecurity,
    TlsCaOption,
    TlsCertOption,
    TlsKeyOption,
    TokenOption,
)

DEFAULT_SERVICE_URL = "127.0.0.1:6650"
SUB_TYPES = ("exclusive", "shared", "failover", "key_shared")

ServiceUrlOption = Annotated[
    str,
    typer.Option(
        "--service-url",
        envvar="BALLAST_SERVICE_URL",
        help="Any broker's host:port (the client follows lookups from there).",
    ),
]
TopicOption = Annotated[str, typer.Option("--topic", help="Topic name, /namespace/topic.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]


@dataclass
class Progress:
    """Totals and the rate since the last progress line."""

    label: str
    count: int = 0
    bytes: int = 0
    started: float = field(default_factory=time.monotonic)
    _last: tuple[float, int] | None = None

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def line(self) -> str:
        now = time.monotonic()
        then, count = self._last or (self.started, 0)
        rate = (self.count - count) / max(now - then, 1e-6)
        self._last = (now, self.count)
        return f"{self.label}: {self.count} messages, {self.bytes / 1e6:.2f} MB, {rate:,.0f} msg/s"

    def elapsed(self) -> float:
        return time.monotonic() - self.started


async def _report(progress: Progress, quiet: bool) -> None:
    while True:
        await asyncio.sleep(1.0)
        if not quiet:
            print(progress.line(), file=sys.stderr, flush=True)


def _url(service_url: str, security: ClientSecurity | None = None) -> str:
    if "://" in service_url:
        return service_url
    scheme = "https" if security is not None and security.secure else "http"
    return f"{scheme}://{service_url}"


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


@dataclass
class ProduceSummary:
    """What `produce` did."""

    topic: str
    sent: int
    failed: int
    bytes: int
    seconds: float
    msg_per_second: float
    errors: list[str]


async def produce(
    service_url: str,
    topic: str,
    *,
    count: int,
    rate: float,
    size: int,
    reliable: bool,
    partitions: int,
    name: str,
    quiet: bool = False,
    security: ClientSecurity | None = None,
    schema_subject: str | None = None,
    payload_template: str | None = None,
) -> ProduceSummary:
    """Send `count` messages (0: until interrupted) at up to `rate` per second.

    With `schema_subject` the producer resolves the subject's latest version (and stamps
    it on every message); `payload_template` (``{i}`` is the sequence number) gives the
    payload instead of the default filler, e.g. ``'{"id": {i}}'`` for a JSON schema.
    """
    from danube import DanubeClientBuilder, DispatchStrategy

    client = (
        await (security or ClientSecurity())
        .apply(DanubeClientBuilder().service_url(_url(service_url, security)))
        .build()
    )
    builder = client.new_producer().with_topic(topic).with_name(name)
    if reliable:
        builder = builder.with_dispatch_strategy(DispatchStrategy.RELIABLE)
    if partitions:
        builder = builder.with_partitions(partitions)
    if schema_subject:
        builder = builder.with_schema_subject(schema_subject)
    producer = builder.build()
    await producer.create()
    progress = Progress("produced")
    reporter = asyncio.create_task(_report(progress, quiet))
    stop = _stop_event()
    errors: list[str] = []
    failed = 0
    padding = b"x" * max(0, size - 16)
    try:
        i = 0
        while (count == 0 or i < count) and not stop.is_set():
            if rate > 0:
                delay = progress.started + i / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            if payload_template is not None:
                payload = payload_template.replace("{i}", str(i)).encode()
            else:
                payload = f"{i:015d} ".encode() + padding
            try:
                await producer.send(payload, {"seq": str(i)})
                progress.add(len(payload))
            except Exception as exc:  # the client raises raw gRPC errors
                failed += 1
                if len(errors) < 5:
                    errors.append(_error_text(exc))
                if failed >= 10 and progress.count == 0:
                    break
            i += 1
    finally:
        reporter.cancel()
        await producer.close()
    seconds = progress.elapsed()
    return ProduceSummary(
        topic, progress.count, failed, progress.bytes, seconds, progress.count / seconds, errors
    )


@dataclass
class ConsumeSummary:
    """What `consume` received."""

    topic: str
    subscription: str
    received: int
    bytes: int
    seconds: float
    msg_per_second: float
    first_offset: int | None
    last_offset: int | None
    redelivered: int  # offsets received more than once (at-least-once delivery)
    partitions: list[str]


async def consume(
    service_url: str,
    topic: str,
    subscription: str,
    *,
    sub_type: str,
    count: int,
    name: str,
    idle_timeout: float = 0.0,
    wait_seconds: float = 30.0,
    quiet: bool = False,
    security: ClientSecurity | None = None,
) -> ConsumeSummary:
    """Receive and ack `count` messages (0: until interrupted or idle for `idle_timeout`)."""
    from danube import DanubeClientBuilder, DanubeError, SubType

    client = (
        await (security or ClientSecurity())
        .apply(DanubeClientBuilder().service_url(_url(service_url, security)))
        .build()
    )
    consumer = (
        client.new_consumer()
        .with_topic(topic)
        .with_consumer_name(name)
        .with_subscription(subscription)
        .with_subscription_type(SubType[sub_type.upper()])
        .build()
    )
    # Like Danube, a topic has no partitions until a producer created it: wait for one.
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            await consumer.subscribe()
            break
        except DanubeError as exc:
            if "no partitions" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
    queue = await consumer.receive()
    progress = Progress("consumed")
    reporter = asyncio.create_task(_report(progress, quiet))
    stop = _stop_event()
    seen: set[tuple[str, int]] = set()
    redelivered = 0
    first: int | None = None
    last: int | None = None
    try:
        while (count == 0 or progress.count < count) and not stop.is_set():
            getter = asyncio.ensure_future(queue.get())
            stopper = asyncio.ensure_future(stop.wait())
            done, _ = await asyncio.wait(
                {getter, stopper},
                timeout=idle_timeout or None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            stopper.cancel()
            if getter not in done:
                getter.cancel()
                break
            message: Any = getter.result()
            offset = message.msg_id.topic_offset
            ident = (message.msg_id.topic_name, offset)
            if ident in seen:
                redelivered += 1
            seen.add(ident)
            first = offset if first is None else first
            last = offset
            progress.add(len(message.payload))
            await consumer.ack(message)
    finally:
        reporter.cancel()
        await consumer.close()
    seconds = progress.elapsed()
    return ConsumeSummary(
        topic,
        subscription,
        progress.count,
        progress.bytes,
        seconds,
        progress.count / seconds,
        first,
        last,
        redelivered,
        sorted(consumer._consumers),
    )


def _print_summary(summary: Any, as_json: bool) -> None:
    data = asdict(summary)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    typer.echo(
        " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items())
    )


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _error_text(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    code = getattr(exc, "code", None)
    if callable(details) and callable(code):
        return f"{code().name}: {details()}"
    return str(exc) or type(exc).__name__


def _security(
    ca: str | None, cert: str | None, key: str | None, token: str | None
) -> ClientSecurity:
    try:
        return ClientSecurity(ca, cert, key, token)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def register(app: typer.Typer) -> None:
    """Add `produce` and `consume` to `app`."""

    @app.command("produce")
    def produce_cmd(
        topic: TopicOption,
        count: Annotated[int, typer.Option("--count", min=0, help="Messages (0: forever).")] = 100,
        rate: Annotated[float, typer.Option("--rate", min=0, help="Per second (0: max).")] = 0,
        size: Annotated[int, typer.Option("--size", min=16, help="Payload bytes.")] = 1024,
        reliable: Annotated[bool, typer.Option("--reliable", help="A reliable topic.")] = False,
        partitions: Annotated[
            int, typer.Option("--partitions", min=0, help="Publish to N partitions.")
        ] = 0,
        name: Annotated[str | None, typer.Option("--name", help="Producer name.")] = None,
        schema_subject: Annotated[
            str | None,
            typer.Option("--schema-subject", help="Produce with this subject's latest schema."),
        ] = None,
        payload: Annotated[
            str | None,
            typer.Option("--payload", help="Payload text; {i} is the sequence number."),
        ] = None,
        service_url: ServiceUrlOption = DEFAULT_SERVICE_URL,
        as_json: JsonOption = False,
        tls_ca: TlsCaOption = None,
        tls_cert: TlsCertOption = None,
        tls_key: TlsKeyOption = None,
        token: TokenOption = None,
    ) -> None:
        """Send messages with the danube client; progress on stderr, then a summary."""
        security = _security(tls_ca, tls_cert, tls_key, token)
        try:
            summary = asyncio.run(
                produce(
                    service_url,
                    topic,
                    count=count,
                    rate=rate,
                    size=size,
                    reliable=reliable,
                    partitions=partitions,
                    name=name or f"ballast-produce-{os.getpid()}",
                    security=security,
                    schema_subject=schema_subject,
                    payload_template=payload,
                )
            )
        except Exception as exc:
            raise _fail(f"producing to {topic} via {service_url}: {_error_text(exc)}") from None
        _print_summary(summary, as_json)
        if summary.failed:
            raise typer.Exit(1)

    @app.command("consume")
    def consume_cmd(
        topic: TopicOption,
        subscription: Annotated[str, typer.Option("--subscription", help="Subscription.")],
        sub_type: Annotated[
            str, typer.Option("--type", help="exclusive, shared, failover or key_shared.")
        ] = "shared",
        count: Annotated[int, typer.Option("--count", min=0, help="Messages (0: forever).")] = 0,
        idle_timeout: Annotated[
            float, typer.Option("--idle-timeout", min=0, help="Stop after this idle (s).")
        ] = 0,
        name: Annotated[str | None, typer.Option("--name", help="Consumer name.")] = None,
        service_url: ServiceUrlOption = DEFAULT_SERVICE_URL,
        as_json: JsonOption = False,
        tls_ca: TlsCaOption = None,
        tls_cert: TlsCertOption = None,
        tls_key: TlsKeyOption = None,
        token: TokenOption = None,
    ) -> None:
        """Receive and ack messages with the danube client; progress, then a summary."""
        security = _security(tls_ca, tls_cert, tls_key, token)
        if sub_type not in SUB_TYPES:
            raise _fail(f"--type {sub_type!r}: use one of {', '.join(SUB_TYPES)}")
        try:
            summary = asyncio.run(
                consume(
                    service_url,
                    topic,
                    subscription,
                    sub_type=sub_type,
                    count=count,
                    name=name or f"ballast-consume-{os.getpid()}",
                    idle_timeout=idle_timeout,
                    security=security,
                )
            )
        except Exception as exc:
            raise _fail(f"consuming {topic} via {service_url}: {_error_text(exc)}") from None
        _print_summary(summary, as_json)
