"""Several connections to one store, each call on a free one: one slow read holds back no other.

A store client runs its calls one at a time (the chDB backend under a lock, an HTTP client on one
session), so REST requests over one client queue behind the slowest of them: a trace export of
a minute held back ``/metrics`` and every page load. :class:`StorePool` is a
:class:`~argus.store.Store` over ``size`` connections (:meth:`~argus.store.Store.beside`): each
call takes a free one, waiting only when all are busy. ``argus server`` gives its REST API one
of :data:`DEFAULT_POOL_SIZE`.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from argus.errors import ConfigError
from argus.store import Store

__all__ = ["DEFAULT_POOL_SIZE", "StorePool"]

#: Connections of the REST API's pool: reads that run at once before the next one waits.
DEFAULT_POOL_SIZE = 4


class StorePool:
    """:class:`~argus.store.Store` over ``members`` (connections to one store), a free one per call.

    Thread-safe: a call waits only while every member is busy. Closing the pool closes every
    member. Raises what the members raise (``StoreError``, ``TooManyRows``).

    Raises:
        ConfigError: no member.
    """

    def __init__(self, members: Sequence[Store], free: queue.SimpleQueue[int] | None = None) -> None:
        if not members:
            raise ConfigError("a store pool needs at least one connection")
        self.members = list(members)
        self.url = members[0].url
        self.embedded = members[0].embedded
        #: Indices of the members free now; shared with the pool's views (:meth:`reading_at_most`).
        self._free: queue.SimpleQueue[int] = queue.SimpleQueue() if free is None else free
        if free is None:
            for i in range(len(self.members)):
                self._free.put(i)

    @classmethod
    def opened_beside(cls, store: Store, size: int = DEFAULT_POOL_SIZE) -> StorePool:
        """A pool of ``size`` new connections beside ``store``'s (:meth:`Store.beside`).

        Raises:
            StoreError: a connection cannot be opened (those opened are closed).
        """
        members: list[Store] = []
        try:
            for _ in range(size):
                members.append(store.beside())
        except BaseException:
            for member in members:
                member.close()
            raise
        return cls(members)

    @contextmanager
    def _member(self) -> Iterator[Store]:
        i = self._free.get()
        try:
            yield self.members[i]
        finally:
            self._free.put(i)

    def insert(self, table: str, data: pa.Table, *, dedup_token: str | None = None) -> None:
        with self._member() as member:
            member.insert(table, data, dedup_token=dedup_token)

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None) -> pa.Table:
        with self._member() as member:
            return member.query(sql, parameters)

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None) -> None:
        with self._member() as member:
            member.command(sql, parameters)

    def close(self) -> None:
        for member in self.members:
            member.close()

    def beside(self) -> Store:
        return self.members[0].beside()

    def reading_at_most(self, rows: int) -> StorePool:
        """The pool with every member's queries scanning at most ``rows`` rows: the same connections,
        taken from the same free list as the pool's own calls."""
        return StorePool([member.reading_at_most(rows) for member in self.members], self._free)
