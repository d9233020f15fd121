"""The body of an HTTP/1.1 request, framed and decoded strictly and never past a size limit.

``agl-bridge collect`` faces whatever reaches its port, so the body is read by this one reader
and not by ad-hoc ``int()`` calls: Python's ``int`` accepts ``-1``, ``0x5``, ``1_0``, `` 5 `` and
non-ASCII digits, and refuses 5,000 digits with an exception. Each of those once became a
request read to the end of the stream or a connection closed without an answer.

Framing follows RFC 9112 (section 6):

* ``Transfer-Encoding``: RFC 9112 lets it override ``Content-Length``, but a request with both
  is what a request-smuggling attempt looks like, so it is refused (400); so is one over
  HTTP/1.0 (400) and one whose last coding is not ``chunked`` (400, a MUST: its length cannot
  be known, whatever the codings). A known length with another coding before ``chunked`` is
  501, the answer for a transfer coding the server does not implement.
* ``Content-Length`` is one field of ASCII digits (else 400); none at all is 411.
* ``chunked``: a chunk size is 1 to 16 hex digits (no sign, no ``0x``, no spaces), a size line
  with its extensions is at most ``MAX_LINE`` bytes, lines end in CRLF, and the trailer section
  holds at most ``MAX_TRAILERS`` well-formed fields.

The limit (``--max-request-bytes``) holds twice, as the body is read and never after buffering:
on the *wire* (everything after the header section, chunk framing and trailers included) and on
the *decoded* body (after ``gzip``/``deflate``, so a small bomb cannot inflate past it). A body
over it is 413, refused as soon as it is known: a ``Content-Length`` over it before reading a
byte. Content codings: ``gzip`` (every member of a multi-member stream; trailing garbage is
400), ``deflate`` (zlib or raw), ``identity``; anything else is 415.

Every refusal is a ``Refused`` with the HTTP status to answer; the caller answers and closes.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from typing import BinaryIO

from google.rpc import code_pb2

MAX_LINE = 4096  # a chunk-size line with its extensions, or one trailer field
MAX_TRAILERS = 32
_PIECE = 64 * 2**10  # read and inflate in pieces of this size: no read buffers the whole body

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"(?:[\t !#-\[\]-~\x80-\xff]|\\[\t -~\x80-\xff])*"'
_CHUNK_EXT = rb"(?:[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + \
    _QUOTED + rb"))?)*"
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})" + _CHUNK_EXT + rb"\r\n")
_TRAILER_LINE = re.compile(_TOKEN + rb":[\t -~\x80-\xff]*\r\n")
_TOKEN_STR = re.compile(_TOKEN.decode())
_DIGITS = re.compile(r"[0-9]+")  # not \d, not str.isdigit: those take any script's digits
_GZIP_MAGIC = b"\x1f\x8b"


class Refused(Exception):
    """A request answered with an error: ``status`` is the HTTP status (``rpc_code`` the gRPC one).

    Raised here for bodies that cannot or must not be read, and by the receiver for the rest.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message

    @property
    def rpc_code(self) -> int:
        """The ``google.rpc.Code`` that goes with the status (google/rpc/code.proto's table)."""
        return _RPC_CODES.get(self.status, code_pb2.INVALID_ARGUMENT if self.status < 500
                              else code_pb2.INTERNAL)


_RPC_CODES = {401: code_pb2.UNAUTHENTICATED, 404: code_pb2.NOT_FOUND,
              408: code_pb2.DEADLINE_EXCEEDED, 413: code_pb2.RESOURCE_EXHAUSTED,
              431: code_pb2.RESOURCE_EXHAUSTED, 501: code_pb2.UNIMPLEMENTED,
              503: code_pb2.UNAVAILABLE, 505: code_pb2.UNIMPLEMENTED}


@dataclass(frozen=True)
class Framing:
    """How the body is delimited and encoded: known before a byte of it is read."""

    length: int | None  # Content-Length; None for chunked
    coding: str  # "identity", "gzip" or "deflate"

    @property
    def empty(self) -> bool:
        return self.length == 0


def framing(headers: Message, request_version: str, limit: int) -> Framing:
    """The body's framing from the header section; Refused (400/411/413/415/501) if refused."""
    transfer = headers.get_all("Transfer-Encoding")
    lengths = headers.get_all("Content-Length")
    if transfer is not None:
        if lengths is not None:
            raise Refused(400, "both Transfer-Encoding and Content-Length: ambiguous framing")
        if request_version == "HTTP/1.0":
            raise Refused(400, "Transfer-Encoding in an HTTP/1.0 request: faulty framing")
        _check_transfer_codings(transfer)
        length = None
    elif lengths is None:
        raise Refused(411, "Content-Length or Transfer-Encoding: chunked required")
    else:
        length = _content_length(lengths, limit)
    return Framing(length, _content_coding(headers.get_all("Content-Encoding") or []))


def _content_length(fields: list[str], limit: int) -> int:
    if len(fields) != 1:
        raise Refused(400, f"{len(fields)} Content-Length fields")
    value = fields[0].strip(" \t")
    if not _DIGITS.fullmatch(value):
        raise Refused(400, f"Content-Length {value[:40]!r} is not a decimal number")
    digits = value.lstrip("0")
    if len(digits) > len(str(limit)) or int(digits or 0) > limit:  # never int() 5,000 digits
        raise Refused(413, f"request of {_shorten(digits)} bytes exceeds the limit of {limit}")
    return int(digits or 0)


def _check_transfer_codings(fields: list[str]) -> None:
    codings = [c.strip(" \t") for f in fields for c in f.split(",")]
    codings = [c for c in codings if c]  # RFC 9110 5.6.1: empty list elements are ignored
    if not codings or codings[-1].lower() != "chunked":
        # RFC 9112 6.3: the length cannot be known; this MUST is 400, even for unknown codings
        raise Refused(400, f"Transfer-Encoding {', '.join(codings)[:80]!r} does not end in "
                           f"chunked")
    others = codings[:-1]
    if any(c.lower() == "chunked" for c in others):
        raise Refused(400, "chunked applied more than once")
    if any(not _TOKEN_STR.fullmatch(c.split(";")[0].strip(" \t")) for c in others):
        raise Refused(400, f"malformed Transfer-Encoding {', '.join(codings)[:80]!r}")
    if others:
        raise Refused(501, f"transfer coding {', '.join(others)[:80]!r} is not implemented; "
                           f"send chunked alone")


def _content_coding(fields: list[str]) -> str:
    codings = [c.strip(" \t").lower() for f in fields for c in f.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return "identity"
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return "deflate" if codings[0] == "deflate" else "gzip"
    raise Refused(415, f"unsupported Content-Encoding {', '.join(codings)[:80]!r}; "
                       f"use gzip, deflate or identity")


def read_body(rfile: BinaryIO, frame: Framing, limit: int) -> bytearray:
    """The decoded body, read as framed; Refused (400/408/413) as soon as anything is wrong."""
    sink = _Sink(limit) if frame.coding == "identity" else _Inflater(limit, frame.coding)
    try:
        if frame.length is not None:
            _read_exactly(rfile, frame.length, sink.feed, "body shorter than Content-Length")
        else:
            _read_chunked(rfile, limit, sink.feed)
    except TimeoutError:
        raise Refused(408, "timed out waiting for the request body") from None
    except OSError as exc:  # the client went away: the answer will most likely not reach it
        raise Refused(400, f"connection lost while reading the body: {exc}") from None
    return sink.finish()


def _read_exactly(rfile: BinaryIO, n: int, feed: Callable[[bytes], None], short: str) -> None:
    while n:
        piece = rfile.read(min(n, _PIECE))
        if not piece:
            raise Refused(400, short)
        feed(piece)
        n -= len(piece)


def _read_chunked(rfile: BinaryIO, limit: int, feed: Callable[[bytes], None]) -> None:
    wire = 0  # every byte of the body as sent: sizes, extensions, data, CRLFs, trailers

    def line(what: str) -> bytes:
        nonlocal wire
        raw = rfile.readline(MAX_LINE + 1)
        wire += len(raw)
        if wire > limit:
            raise Refused(413, f"chunked request exceeds the limit of {limit} bytes")
        if len(raw) > MAX_LINE:
            raise Refused(400, f"{what} longer than {MAX_LINE} bytes")
        if not raw.endswith(b"\r\n"):
            raise Refused(400, f"{what} cut short or not ended by CRLF")
        return raw

    while True:
        match = _CHUNK_LINE.fullmatch(line("chunk-size line"))
        if match is None:
            raise Refused(400, "malformed chunk-size line")
        size = int(match.group(1), 16)  # 1-16 ASCII hex digits: never negative
        if size == 0:
            break
        wire += size + 2
        if wire > limit:
            raise Refused(413, f"chunked request exceeds the limit of {limit} bytes")
        _read_exactly(rfile, size, feed, "chunked body cut short")
        if rfile.read(2) != b"\r\n":
            raise Refused(400, "chunk data not followed by CRLF")
    for _ in range(MAX_TRAILERS + 1):
        field = line("trailer field")
        if field == b"\r\n":
            return
        if not _TRAILER_LINE.fullmatch(field):
            raise Refused(400, "malformed trailer field")
    raise Refused(400, f"more than {MAX_TRAILERS} trailer fields")


class _Sink:
    """An identity-coded body: collected as it comes, refused once past the limit."""

    def __init__(self, limit: int) -> None:
        self.limit, self.out = limit, bytearray()

    def feed(self, data: bytes) -> None:
        if len(self.out) + len(data) > self.limit:
            raise Refused(413, f"request exceeds the limit of {self.limit} bytes")
        self.out += data

    def finish(self) -> bytearray:
        return self.out


class _Inflater(_Sink):
    """A gzip or deflate body inflated as it arrives, never past ``limit`` (no zip bombs).

    ``decompress(data, max_length)`` with the room left plus one byte: reaching that length
    means the body is too large, so nothing is ever inflated beyond ``limit + 1``. Like the
    ``gzip`` module, every member of a multi-member gzip stream is inflated.
    """

    def __init__(self, limit: int, coding: str) -> None:
        super().__init__(limit)
        self.coding = coding
        self._z: zlib._Decompress | None = None  # the member being inflated
        self._head = b""  # the first bytes of the next member, until its format is known
        self._members = 0

    def feed(self, data: bytes) -> None:
        while data:
            if self._z is None:
                data = self._head + data
                if len(data) < 2:
                    self._head = data
                    return
                self._head, self._z = b"", self._start(data[:2])
            room = self.limit - len(self.out) + 1
            try:
                out = self._z.decompress(data, room)
            except zlib.error as exc:
                raise Refused(400, f"body is not valid {self.coding}: {exc}") from None
            if len(out) == room:
                raise Refused(413, f"decompressed request exceeds the limit of {self.limit} "
                                   f"bytes")
            self.out += out
            if self._z.eof:
                data, self._z = self._z.unused_data, None
                self._members += 1
            else:  # out < room: zlib took all the input it could and holds no pending output
                data = self._z.unconsumed_tail

    def _start(self, head: bytes) -> zlib._Decompress:
        if head == _GZIP_MAGIC:
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        if self._members:  # after a member only another gzip member may follow
            raise Refused(400, f"data after the end of the {self.coding} stream")
        if (head[0] & 0x0F) == 8 and int.from_bytes(head, "big") % 31 == 0:
            return zlib.decompressobj(zlib.MAX_WBITS)  # zlib header (RFC 1950)
        return zlib.decompressobj(-zlib.MAX_WBITS)  # raw deflate, as some clients send

    def finish(self) -> bytearray:
        if self._z is not None or self._head or not self._members:
            raise Refused(400, f"body is not valid {self.coding}: stream cut short")
        return self.out


def _shorten(digits: str) -> str:
    return digits if len(digits) <= 24 else f"{digits[:12]}...({len(digits)} digits)"
