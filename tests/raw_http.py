"""A raw-socket HTTP/1.1 client for tests that must send what no HTTP library would send.

``exchange`` sends bytes as they are (on a thread, so a server that answers before reading
everything cannot deadlock us), half-closes, and reads until the server closes.
``parse_responses`` is strict: anything that is not a sequence of well-formed responses, each
with a status line, header fields and exactly ``Content-Length`` bytes of body, is an error.
"""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass

_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) [^\r\n]*\r\n")
_FIELD = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):[ \t]*([^\r\n]*?)[ \t]*\r\n")


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes


class Malformed(AssertionError):
    """The server's bytes are not well-formed HTTP/1.1 responses."""


def parse_responses(data: bytes) -> list[Response]:
    """Every response in ``data`` (1xx interim ones included), or Malformed."""
    responses, pos = [], 0
    while pos < len(data):
        status = _STATUS_LINE.match(data, pos)
        if status is None:
            raise Malformed(f"no status line at byte {pos}: {data[pos:pos + 80]!r}")
        pos, headers = status.end(), {}
        while not data.startswith(b"\r\n", pos):
            field = _FIELD.match(data, pos)
            if field is None:
                raise Malformed(f"malformed header field at byte {pos}: {data[pos:pos + 80]!r}")
            headers[field.group(1).decode().lower()] = field.group(2).decode("latin-1")
            pos = field.end()
        pos += 2
        code = int(status.group(1))
        length = 0 if code < 200 else int(headers.get("content-length", "-1"))
        if length < 0 or pos + length > len(data):
            raise Malformed(f"{code} without a complete Content-Length body: {headers}")
        responses.append(Response(code, headers, data[pos:pos + length]))
        pos += length
    return responses


def exchange(port: int, payload: bytes | Iterable[bytes], *, close_write: bool = True,
             timeout: float = 20.0, host: str = "127.0.0.1") -> bytes:
    """Send ``payload`` (bytes, or pieces sent one after another) and read until EOF.

    With ``close_write`` the sending side is shut once all is sent, so a server waiting for
    more body sees the end of the stream; without it, what comes back must come back unasked.
    A server that neither answers nor closes within ``timeout`` fails the test.
    """
    pieces = [payload] if isinstance(payload, bytes) else payload
    with socket.create_connection((host, port), timeout=timeout) as sock:
        def send() -> None:
            try:
                for piece in pieces:
                    sock.sendall(piece)
                if close_write:
                    sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server answered and closed before reading it all: allowed
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        received = bytearray()
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # after the answer: what was received is what is judged
        except TimeoutError:
            raise AssertionError(f"no end of the answer in {timeout} s; got {bytes(received)!r}"
                                 ) from None
        sender.join(timeout)
    return bytes(received)


def final(data: bytes) -> Response:
    """The one final (non-1xx) response in ``data``; Malformed if there is not exactly one."""
    finals = [r for r in parse_responses(data) if r.status >= 200]
    if len(finals) != 1:
        raise Malformed(f"{len(finals)} final responses in {data[:300]!r}")
    return finals[0]
