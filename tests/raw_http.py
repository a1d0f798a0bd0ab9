"""HTTP/1.1 requests written and read byte for byte over a real socket: what the tests of the
routes the protocol answers itself (coordinator/direct_routes.py) need and an HTTP client
hides (chunked bodies, several requests in one write, a client that leaves)."""

from __future__ import annotations

import asyncio

Reply = tuple[int, dict[str, str], bytes]


def request_bytes(
    path: str,
    body: bytes,
    *,
    chunked: bool = False,
    content_type: bytes = b"application/json",
    extra: bytes = b"",
) -> bytes:
    """A POST of ``body``: with a declared length, or chunked (which the ASGI path always
    serves)."""
    head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: %s\r\n%s" % (
        path.encode(),
        content_type,
        extra,
    )
    if chunked:
        chunk = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
        return head + b"Transfer-Encoding: chunked\r\n\r\n%s0\r\n\r\n" % chunk
    return head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


async def read_reply(reader: asyncio.StreamReader) -> Reply:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers, await reader.readexactly(int(headers["content-length"]))


async def exchange(port: int, *requests: bytes) -> list[Reply]:
    """Send ``requests`` in one write (pipelined when several) and read their replies."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(requests))
        return [await read_reply(reader) for _ in requests]
    finally:
        writer.close()
