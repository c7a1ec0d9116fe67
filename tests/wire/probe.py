"""The legitimate client of tests/wire, in a process of its own: its latencies are then the
server's, not the wait for a test loop busy with thousands of attacking connections.

`python probe.py URL TOPIC TIMEOUT` prints READY, then obeys lines on stdin: ``start``
builds a `danube-client` producer on a connection of its own and sends one message after
another (SERVING once the first, untimed, was served); ``stop`` sends five more, closes the producer
and prints ``RESULT {"latencies": [...], "errors": [...]}``. It exits at the end of stdin.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from danube import DanubeClientBuilder


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def probe(url: str, topic: str, timeout: float, stop: asyncio.Event) -> dict[str, Any]:
    """One watch: sends until `stop` and five more (served after the attack too)."""
    client = await DanubeClientBuilder().service_url(f"http://{url}").build()
    producer = client.new_producer().with_topic(topic).with_name("legit").build()
    await producer.create()
    # Served once before the attack starts, untimed: connecting and the first call's
    # set-up (a gateway's link to the broker) are not what the bound is about.
    await asyncio.wait_for(producer.send(b"ready"), timeout)
    say("SERVING")
    latencies: list[float] = []
    errors: list[str] = []
    after = 0
    try:
        while after < 5:
            began = time.monotonic()
            try:
                await asyncio.wait_for(producer.send(b"still here"), timeout)
            except Exception as exc:  # the test's assertion names it
                errors.append(f"{type(exc).__name__}: {exc}")
            latencies.append(time.monotonic() - began)
            after += stop.is_set()
            await asyncio.sleep(0.02)  # a steady client, not a flood of its own
    finally:
        await producer.close()
    return {"latencies": latencies, "errors": errors}


def report(watch: asyncio.Task[dict[str, Any]]) -> None:
    """A watch that could not begin (the test waiting for SERVING reads why)."""
    if not watch.cancelled() and watch.exception() is not None:
        say(f"FAILED {watch.exception()!r}")


async def main(url: str, topic: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    say("READY")
    stop = asyncio.Event()
    watch: asyncio.Task[dict[str, Any]] | None = None
    while command := (await stdin.readline()).decode().strip():
        if command == "start":
            stop.clear()
            watch = asyncio.create_task(probe(url, topic, timeout, stop))
            watch.add_done_callback(report)
        elif command == "stop" and watch is not None:
            stop.set()
            say("RESULT " + json.dumps(await watch))
            watch = None


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
