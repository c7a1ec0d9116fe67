"""`BatchedReads`: the point reads of many callers in one round trip.

A broker opening 64 inherited topics, or answering 32 clients' lookups at once, reads one
key per topic per step; each read is a round trip with its own cost in the broker's
event loop. Reads asked at the same moment, or while the previous batch is on its way,
go together in one `MetadataStore.get_many` (one read-only transaction, at most 128
keys). A batch is sent after every read in it was asked, so each answer is at least as
fresh as a read of its own would have been.
"""

from __future__ import annotations

import asyncio
import itertools

from ballast.metadata._codec import MAX_TXN_OPS
from ballast.metadata.store import KeyValue, MetadataStore, ValueDecodeError

__all__ = ["BatchedReads"]


# Batches on their way at once. One would put every read behind a slow one (a topic a
# client waits for behind a failover's hundred); under load, reads wait for a free slot
# and go together.
_IN_FLIGHT = 4


class BatchedReads:
    """`get` as the store's, batched with the other callers' (a few batches in flight)."""

    def __init__(self, store: MetadataStore) -> None:
        self._store = store
        self._waiting: dict[str, list[asyncio.Future[KeyValue | None]]] = {}
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None if absent (raises as `MetadataStore.get`)."""
        answer: asyncio.Future[KeyValue | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(answer)
        self._schedule()
        return await answer

    def _schedule(self) -> None:
        if self._scheduled or not self._waiting or self._in_flight >= _IN_FLIGHT:
            return
        self._scheduled = True
        task = asyncio.get_running_loop().create_task(self._send(), name="metadata/reads")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self) -> None:
        await asyncio.sleep(0)  # the other callers of this moment ask first
        self._scheduled = False
        keys = list(itertools.islice(self._waiting, MAX_TXN_OPS))
        readers = {key: self._waiting.pop(key) for key in keys}
        self._in_flight += 1
        self._schedule()  # more than one transaction's worth waits: the next batch
        values: list[KeyValue | BaseException | None]
        try:
            values = list(await self._store.get_many(keys))
        except ValueDecodeError:
            # A value that is not JSON fails its own readers only: each key alone.
            values = await asyncio.gather(
                *(self._store.get(key) for key in keys), return_exceptions=True
            )
        except Exception as exc:  # the store's failure is every reader's
            values = [exc] * len(keys)
        except asyncio.CancelledError:
            for answer in itertools.chain(*readers.values()):
                answer.cancel()
            raise
        finally:
            self._in_flight -= 1
        for key, value in zip(keys, values, strict=True):
            for answer in readers[key]:
                if answer.done():
                    continue  # its reader was cancelled
                if isinstance(value, BaseException):
                    answer.set_exception(value)
                else:
                    answer.set_result(value)
        self._schedule()  # what was asked while this batch was out
