"""A loopback TCP proxy that can cut its link, and balance over several upstreams: in front of
each member's coordinator connection (the link fault), and in front of the coordinator
replicas (standing in for a Kubernetes Service, which sends a new connection to a live pod)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Sequence

import psutil

PASS = "pass"
# The peer sees its connection reset and new ones refused, as when a pod's node is gone.
DROP = "drop"
# Bytes vanish and nothing answers, as behind a dead route: only timeouts notice.
BLACKHOLE = "blackhole"


class _Link:
    """One client connection and its upstream; ``pid`` is the process that opened it, looked
    up only when a cut aims at some processes."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.swallowed = False
        self.pid: int | None = None
        self.pid_known = False

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None and writer.transport is not None:
                writer.transport.abort()


class TcpProxy:
    """Listens on a free loopback port; each new connection goes to the next upstream in
    turn that accepts it."""

    def __init__(self, upstreams: Sequence[tuple[str, int]]) -> None:
        self.upstreams = list(upstreams)
        self.mode = PASS
        self.only_pids: frozenset[int] | None = None
        self.port = 0
        self._next = 0
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        if self._server is not None:
            await self._server.wait_closed()

    def cut(self, mode: str, *, only_pids: frozenset[int] | None = None) -> None:
        """Cut the link, for every client or only the connections ``only_pids`` opened (one
        broker proxy serves every member; the fault strikes one of them)."""
        self.mode = mode
        self.only_pids = only_pids
        if only_pids is not None:
            _learn_owners(self._links)
        if mode == DROP:
            for link in list(self._links):
                if self._cuts(link):
                    link.abort()

    def heal(self) -> None:
        """Back to passing; a connection whose bytes were swallowed is beyond repair (its
        peer would read a torn stream), so it is reset and the peer reconnects."""
        self.mode = PASS
        self.only_pids = None
        for link in list(self._links):
            if link.swallowed:
                link.abort()

    def _cuts(self, link: _Link) -> bool:
        if self.mode == PASS:
            return False
        return self.only_pids is None or link.pid in self.only_pids

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        if self.only_pids is not None:
            _learn_owners([link])
        if self.mode == DROP and self._cuts(link):
            link.abort()
            return
        self._links.add(link)
        try:
            upstream = await self._connect_upstream()
            if upstream is None:
                link.abort()
                return
            upstream_reader, link.upstream = upstream
            await asyncio.gather(
                self._pipe(link, reader, link.upstream),
                self._pipe(link, upstream_reader, writer),
            )
        finally:
            self._links.discard(link)
            link.abort()

    async def _connect_upstream(
        self,
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for attempt in range(len(self.upstreams)):
            host, port = self.upstreams[(self._next + attempt) % len(self.upstreams)]
            with contextlib.suppress(OSError):
                connection = await asyncio.open_connection(host, port)
                self._next = (self._next + attempt + 1) % len(self.upstreams)
                return connection
        return None

    async def _pipe(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65_536):
                if link.swallowed or (self.mode == BLACKHOLE and self._cuts(link)):
                    link.swallowed = True
                    continue
                writer.write(data)
                await writer.drain()
        link.abort()


def _learn_owners(links: Iterable[_Link]) -> None:
    """Which process opened each connection: the one whose socket's local address is the
    connection's peer (one scan of the machine's TCP sockets)."""
    unknown = {}
    for link in links:
        peer = link.client.get_extra_info("peername")
        if peer is not None and not link.pid_known:
            unknown[tuple(peer[:2])] = link
    if not unknown:
        return
    for connection in psutil.net_connections(kind="tcp"):
        link = unknown.get(tuple(connection.laddr)) if connection.laddr else None
        if link is not None:
            link.pid, link.pid_known = connection.pid, True
