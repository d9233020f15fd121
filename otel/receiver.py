"""Spans from outside the process into span Parquet: an OTLP receiver and a Collector-file import.

``OTLPReceiver`` is ``agl-bridge collect``: for teams without an OpenTelemetry Collector, it
speaks OTLP/HTTP (``POST /v1/traces``, protobuf or OTLP/JSON, gzip/deflate bodies) and OTLP/gRPC
(``TraceService/Export``), and writes through the same ``SpanParquetWriter`` and the same row
mapping (``otlp.py`` -> ``rows.build_row``) as the in-process exporter, so the files are identical.
Answers follow the OTLP specification, so standard exporters retry only what is worth retrying:

* no or wrong bearer token (when one is set): HTTP 401 / gRPC UNAUTHENTICATED;
* a body over ``max_request_bytes`` (before or after decompression): HTTP 413 / RESOURCE_EXHAUSTED;
* a payload that is not an OTLP request: HTTP 400 with a ``google.rpc.Status`` body (protobuf or
  JSON, like the request) / INVALID_ARGUMENT. The server keeps serving;
* spans that cannot become rows: quarantined beside the data, the rest written, and the answer
  carries ``partial_success`` (``rejected_spans``, ``error_message``);
* the writer failing (a full disk): HTTP 503 / UNAVAILABLE, which exporters retry. A batch written
  in part may then arrive twice; the converter skips duplicate span ids.

``stop`` refuses new requests, lets those in flight finish, then closes the writer, which turns
the write-ahead logs into Parquet files.

``import_otlp_json`` is ``agl-bridge import``: the Collector's file exporter writes one OTLP/JSON
request per line; a malformed line is reported with file:line and quarantined, the rest imported.
"""

from __future__ import annotations

import contextlib
import gzip
import hmac
import json
import logging
import os
import socket
import socketserver
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from agl_bridge.otel import otlp
from agl_bridge.otel.parquet_writer import SpanParquetWriter

logger = logging.getLogger(__name__)

TOKEN_ENV = "AGL_BRIDGE_COLLECT_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
TRACES_PATH = "/v1/traces"
GRPC_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
_STOP_WAIT_S = 10.0


class _Refused(Exception):
    """A request answered with an error; ``status`` is HTTP, ``code`` the google.rpc code."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


_GRPC_CODES = {code_pb2.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
               code_pb2.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE}


@dataclass
class ReceiverStats:
    """Counters of one receiver; ``spans_written`` are rows handed to the writer."""

    requests: int = 0
    spans_written: int = 0
    spans_rejected: int = 0
    requests_malformed: int = 0
    requests_unauthorized: int = 0
    requests_too_large: int = 0
    requests_failed: int = 0

    def summary(self) -> str:
        return (f"{self.requests} request(s) accepted: {self.spans_written} span(s) written, "
                f"{self.spans_rejected} quarantined; refused: {self.requests_malformed} malformed, "
                f"{self.requests_unauthorized} unauthorized, {self.requests_too_large} too large, "
                f"{self.requests_failed} failed to write")


class OTLPReceiver:
    """OTLP/HTTP and OTLP/gRPC trace receiver writing to ``writer`` (closed by ``stop``).

    A port of ``None`` disables that protocol; 0 binds a free port (``http_port`` and
    ``grpc_port`` hold the bound ones after ``start``).
    """

    def __init__(self, writer: SpanParquetWriter, *, host: str = DEFAULT_HOST,
                 http_port: int | None = DEFAULT_HTTP_PORT,
                 grpc_port: int | None = DEFAULT_GRPC_PORT, token: str | None = None,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> None:
        if http_port is None and grpc_port is None:
            raise ValueError("both OTLP/HTTP and OTLP/gRPC are disabled: nothing to serve")
        if max_request_bytes <= 0:
            raise ValueError(f"max_request_bytes must be positive, got {max_request_bytes}")
        self.writer = writer
        self.host = host
        self.http_port, self.grpc_port = http_port, grpc_port
        self.token = token or None
        self.max_request_bytes = max_request_bytes
        self.stats = ReceiverStats()
        self._lock = threading.Condition()
        self._in_flight = 0
        self._stopping = False
        self._http: _HTTPServer | None = None
        self._http_thread: threading.Thread | None = None
        self._grpc: grpc.Server | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> OTLPReceiver:
        try:
            if self.grpc_port is not None:
                self._start_grpc()
            if self.http_port is not None:
                self._start_http()
        except BaseException:
            self.stop(close_writer=False)
            raise
        return self

    def _start_http(self) -> None:
        try:
            self._http = _HTTPServer((self.host, self.http_port), self)
        except OSError as exc:
            raise RuntimeError(f"cannot listen for OTLP/HTTP on {self.host}:{self.http_port}: "
                               f"{exc.strerror or exc}") from None
        self.http_port = self._http.server_address[1]
        self._http_thread = threading.Thread(target=self._http.serve_forever, args=(0.1,),
                                             daemon=True, name="agl-bridge-otlp-http")
        self._http_thread.start()

    def _start_grpc(self) -> None:
        server = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="agl-bridge-otlp-grpc"),
            options=[("grpc.max_receive_message_length", self.max_request_bytes),
                     ("grpc.so_reuseport", 0)])
        # Registered by hand, not with add_TraceServiceServicer_to_server: its deserializer would
        # turn a malformed payload into INTERNAL; raw bytes let us answer INVALID_ARGUMENT.
        handler = grpc.unary_unary_rpc_method_handler(
            _TraceService(self).Export,
            response_serializer=trace_service_pb2.ExportTraceServiceResponse.SerializeToString)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(GRPC_SERVICE, {"Export": handler}),))
        address = f"[{self.host}]:{self.grpc_port}" if ":" in self.host else \
            f"{self.host}:{self.grpc_port}"
        try:
            port = server.add_insecure_port(address)
        except RuntimeError:
            port = 0
        if not port:
            server.stop(None)
            raise RuntimeError(f"cannot listen for OTLP/gRPC on {address}")
        self.grpc_port = port
        server.start()
        self._grpc = server

    def stop(self, *, close_writer: bool = True) -> None:
        """Refuse new requests, finish those in flight, close the writer (logs -> Parquet)."""
        with self._lock:
            self._stopping = True
        http, self._http = self._http, None
        if http is not None:
            http.shutdown()
            http.server_close()
        server, self._grpc = self._grpc, None
        if server is not None:
            server.stop(grace=_STOP_WAIT_S).wait(_STOP_WAIT_S)
        with self._lock:
            if not self._lock.wait_for(lambda: self._in_flight == 0, timeout=_STOP_WAIT_S):
                logger.warning("agl_bridge: %d OTLP request(s) still running at stop",
                               self._in_flight)
        if close_writer:
            self.writer.close()

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def http_endpoint(self) -> str | None:
        if self._http is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.http_port}{TRACES_PATH}"

    @property
    def grpc_endpoint(self) -> str | None:
        if self._grpc is None:
            return None
        return f"[{self.host}]:{self.grpc_port}" if ":" in self.host else \
            f"{self.host}:{self.grpc_port}"

    # -- shared by both protocols ------------------------------------------------------------
    def _authorized(self, authorization: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self.token.encode())

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, n in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)

    @contextlib.contextmanager
    def _in_request(self) -> Iterator[None]:
        with self._lock:
            if self._stopping:
                raise _Refused(503, code_pb2.UNAVAILABLE, "the receiver is shutting down")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._lock.notify_all()

    def _ingest(self, decode: Callable[[bytes], otlp.Conversion], body: bytes
               ) -> trace_service_pb2.ExportTraceServiceResponse:
        """Decode, write the rows, quarantine the rejects; raise _Refused for the error answers."""
        with self._in_request():
            try:
                conversion = decode(body)
            except otlp.MalformedRequest as exc:
                self._count(requests_malformed=1)
                raise _Refused(400, code_pb2.INVALID_ARGUMENT, str(exc)) from None
            try:
                self.writer.write_rows(conversion.rows)
                if conversion.rejected:
                    self.writer.quarantine(conversion.rejected)
            except Exception as exc:
                logger.exception("agl_bridge: writing %d received span(s) failed",
                                 len(conversion.rows))
                self._count(requests_failed=1)
                raise _Refused(503, code_pb2.UNAVAILABLE, f"writing spans failed: {exc}") from None
            self._count(requests=1, spans_written=len(conversion.rows),
                       spans_rejected=len(conversion.rejected))
            return conversion.response()


# -- OTLP/gRPC ---------------------------------------------------------------------------------
class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    """``TraceService/Export``; the request arrives as bytes (see ``_start_grpc``)."""

    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(
            self, request: bytes, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        rx = self.receiver
        metadata = {m.key: m.value for m in context.invocation_metadata()}
        if not rx._authorized(metadata.get("authorization")):
            rx._count(requests_unauthorized=1)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            return rx._ingest(otlp.decode_protobuf, request)
        except _Refused as refused:
            error = refused
        context.abort(_GRPC_CODES[error.code], error.message)
        raise AssertionError("unreachable: context.abort raises")


# -- OTLP/HTTP ---------------------------------------------------------------------------------
class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold up stop()

    def __init__(self, address: tuple[str, int], receiver: OTLPReceiver) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.receiver = receiver
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also resolves the host's FQDN: a DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up mid-request is its problem, not a traceback on our stderr
        logger.debug("agl_bridge collect: connection from %s failed", client_address,
                     exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection
    server_version = "agl-bridge-collect"
    timeout = 30  # a client that stops sending mid-body gives its thread back
    server: _HTTPServer

    def do_POST(self) -> None:
        rx = self.server.receiver
        is_json = _media_type(self.headers.get("Content-Type")) == _JSON_TYPE
        try:
            if urlsplit(self.path).path != TRACES_PATH:
                raise _Refused(404, code_pb2.NOT_FOUND, f"no such path {self.path!r}; "
                                                        f"traces go to {TRACES_PATH}")
            if not rx._authorized(self.headers.get("Authorization")):
                rx._count(requests_unauthorized=1)
                raise _Refused(401, code_pb2.UNAUTHENTICATED, "missing or wrong bearer token")
            media = _media_type(self.headers.get("Content-Type"))
            if media not in (*_PROTOBUF_TYPES, _JSON_TYPE):
                raise _Refused(415, code_pb2.INVALID_ARGUMENT,
                               f"unsupported Content-Type {media!r}; use application/x-protobuf "
                               f"or application/json")
            body = self._body(rx)
            response = rx._ingest(otlp.decode_json if is_json else otlp.decode_protobuf, body)
        except _Refused as refused:
            self._reply(refused.status, _status_body(refused, is_json), is_json, close=True)
            return
        if is_json:
            payload = json.dumps(json_format.MessageToDict(response)).encode()
        else:
            payload = response.SerializeToString()
        self._reply(200, payload, is_json)

    def _body(self, rx: OTLPReceiver) -> bytes:
        limit = rx.max_request_bytes
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raw = self._read_chunked(rx, limit)
        else:
            length = self.headers.get("Content-Length")
            if length is None or not length.strip().isdigit():
                raise _Refused(411, code_pb2.INVALID_ARGUMENT, "Content-Length required")
            if int(length) > limit:
                rx._count(requests_too_large=1)
                raise _Refused(413, code_pb2.RESOURCE_EXHAUSTED,
                               f"request of {int(length)} bytes exceeds the limit of {limit}")
            raw = self.rfile.read(int(length))
            if len(raw) != int(length):
                raise _Refused(400, code_pb2.INVALID_ARGUMENT, "body shorter than Content-Length")
        return _decompress(rx, raw, self.headers.get("Content-Encoding", ""), limit)

    def _read_chunked(self, rx: OTLPReceiver, limit: int) -> bytes:
        body = bytearray()
        while True:
            try:
                size = int(self.rfile.readline(1024).split(b";")[0].strip(), 16)
            except ValueError:
                raise _Refused(400, code_pb2.INVALID_ARGUMENT, "bad chunked encoding") from None
            if size == 0:
                while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return bytes(body)
            if len(body) + size > limit:
                rx._count(requests_too_large=1)
                raise _Refused(413, code_pb2.RESOURCE_EXHAUSTED,
                               f"request exceeds the limit of {limit} bytes")
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise _Refused(400, code_pb2.INVALID_ARGUMENT, "chunked body cut short")
            body += chunk
            self.rfile.readline(8)

    def _reply(self, status: int, payload: bytes, is_json: bool, *, close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", _JSON_TYPE if is_json else _PROTOBUF_TYPES[0])
        self.send_header("Content-Length", str(len(payload)))
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if status == 503:
            self.send_header("Retry-After", "1")
        if close:  # the body may be unread: the connection cannot carry another request
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("agl_bridge collect: " + format, *args)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _decompress(rx: OTLPReceiver, raw: bytes, encoding: str, limit: int) -> bytes:
    """gzip/deflate bodies, decompressed no further than ``limit`` (no zip bombs)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "deflate"):
        raise _Refused(415, code_pb2.INVALID_ARGUMENT, f"unsupported Content-Encoding {encoding!r}")
    for wbits in (zlib.MAX_WBITS | 32, -zlib.MAX_WBITS):  # gzip or zlib header; raw deflate
        try:
            d = zlib.decompressobj(wbits)
            out = d.decompress(raw, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit:
            rx._count(requests_too_large=1)
            raise _Refused(413, code_pb2.RESOURCE_EXHAUSTED,
                           f"decompressed request exceeds the limit of {limit} bytes")
        if d.eof:
            return out
    rx._count(requests_malformed=1)
    raise _Refused(400, code_pb2.INVALID_ARGUMENT, f"body is not valid {encoding}")


def _status_body(refused: _Refused, is_json: bool) -> bytes:
    status = status_pb2.Status(code=refused.code, message=refused.message)
    if is_json:
        return json.dumps(json_format.MessageToDict(status)).encode()
    return status.SerializeToString()


# -- Collector files ---------------------------------------------------------------------------
_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_WRITE_EVERY_ROWS = 10_000


@dataclass
class ImportSummary:
    files: int = 0
    lines: int = 0
    lines_bad: int = 0
    spans_written: int = 0
    spans_rejected: int = 0
    bad: list[str] = field(default_factory=list)  # "file:line: why", in file order

    def summary(self) -> str:
        return (f"imported {self.spans_written} span(s) from {self.lines} line(s) in "
                f"{self.files} file(s); {self.lines_bad} bad line(s), "
                f"{self.spans_rejected} span(s) quarantined")


def otlp_json_files(sources: Sequence[str | os.PathLike[str]], *,
                    exclude: Path | None = None) -> list[Path]:
    """The files to import: given files as they are, directories searched for .json/.jsonl(.gz).

    ``exclude`` (the output directory) is skipped, or its own quarantine files would be read.
    """
    files: list[Path] = []
    for src in sources:
        p = Path(src)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.name.endswith(_SUFFIXES)
                           and not (exclude and q.resolve().is_relative_to(exclude.resolve())))
            if not found:
                raise FileNotFoundError(f"no {', '.join(_SUFFIXES)} files under {p}")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    for path in files:
        with open(path, "rb") as f:
            if f.read(4) == _ZSTD_MAGIC:
                raise ValueError(f"{path} is zstd-compressed; decompress it first (zstd -d)")
    return files


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
    opener = gzip.open if gzipped else open
    with opener(path, "rb") as f:
        yield from enumerate(f, 1)


def import_otlp_json(sources: Sequence[str | os.PathLike[str]], writer: SpanParquetWriter,
                     *, on_bad_line: Callable[[str], None] | None = None) -> ImportSummary:
    """Import Collector file-exporter output (one OTLP/JSON request per line) into ``writer``.

    Bad lines and spans are quarantined with their source ``file:line``; the writer stays open.
    """
    summary = ImportSummary()
    rows: list[dict[str, Any]] = []
    quarantine: list[dict[str, Any]] = []

    def bad(source: str, error: str, line: bytes | None) -> None:
        summary.lines_bad += 1
        summary.bad.append(f"{source}: {error}")
        quarantine.append({"error": error, "source": source,
                           "line": None if line is None else line.decode("utf-8", "replace")})
        if on_bad_line is not None:
            on_bad_line(f"{source}: {error}")

    for path in otlp_json_files(sources, exclude=writer.directory):
        summary.files += 1
        lineno = 0
        try:
            for lineno, line in _lines(path):
                line = line.rstrip(b"\r\n")
                if not line.strip():
                    continue
                summary.lines += 1
                try:
                    conversion = otlp.decode_json(line)
                except otlp.MalformedRequest as exc:
                    bad(f"{path}:{lineno}", str(exc)[:500], line)
                    continue
                rows.extend(conversion.rows)
                quarantine.extend(dict(r, source=f"{path}:{lineno}") for r in conversion.rejected)
                summary.spans_rejected += len(conversion.rejected)
                if len(rows) >= _WRITE_EVERY_ROWS:
                    writer.write_rows(rows)
                    summary.spans_written += len(rows)
                    rows = []
        except (OSError, EOFError, zlib.error) as exc:  # a gzip stream cut short or corrupt
            bad(f"{path}:{lineno + 1}", f"cannot read further: {exc}", None)
    writer.write_rows(rows)
    summary.spans_written += len(rows)
    if quarantine:
        writer.quarantine(quarantine)
    return summary
