"""Spans from outside the process into span Parquet: the OTLP receiver (``agl-bridge collect``).

``OTLPReceiver`` is ``agl-bridge collect``: for teams without an OpenTelemetry Collector, it
speaks OTLP/HTTP (``POST /v1/traces``, protobuf or OTLP/JSON, gzip/deflate bodies) and OTLP/gRPC
(``TraceService/Export``), and writes through the same ``SpanParquetWriter`` and the same row
mapping (``otlp.py`` -> ``rows.build_row``) as the in-process exporter, so the files are identical.

Logs take the same road (``POST /v1/logs``, ``LogsService/Export``; ``otlp_logs.py`` ->
``rows.event_row``): evaluation events (``gen_ai.evaluation.result``) become rows, other log
records are counted and left out. Everything below holds for both signals alike.
Answers follow the OTLP specification, so standard exporters retry only what is worth retrying:

* no or wrong bearer token (when one is set): HTTP 401 / gRPC UNAUTHENTICATED;
* a body over ``max_request_bytes`` (as sent or once decompressed): HTTP 413 / RESOURCE_EXHAUSTED,
  refused as soon as it is known, never buffered or inflated past the limit (``http_body``;
  gRPC itself refuses a message from its length prefix, and a compressed one as it inflates);
* a request HTTP/1.1 cannot frame (a bad ``Content-Length``, chunk size or ``Transfer-Encoding``,
  a malformed request line or field): 400, 411 or 501 as RFC 9112 says. Every refusal, these
  included, is a status line and a ``google.rpc.Status`` body before the connection closes;
* a payload that is not an OTLP request: HTTP 400 with a ``google.rpc.Status`` body (protobuf or
  JSON, like the request) / INVALID_ARGUMENT. The server keeps serving;
* spans that cannot become rows: quarantined beside the data, the rest written, and the answer
  carries ``partial_success`` (``rejected_spans``, ``error_message``);
* the writer failing (a full disk): HTTP 503 / UNAVAILABLE, which exporters retry. A batch written
  in part may then arrive twice; the converter skips duplicate span ids.

``stop`` refuses new requests, lets those in flight finish, then closes the writer, which turns
the write-ahead logs into Parquet files.

``agl-bridge import`` (Collector files) lives in ``collector_files``.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, BinaryIO, cast
from urllib.parse import urlsplit

import grpc
from google.protobuf import json_format
from google.rpc import code_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from agl_bridge.otel import http_body, otlp, otlp_logs
from agl_bridge.otel.http_body import Refused
from agl_bridge.otel.parquet_writer import SpanParquetWriter

logger = logging.getLogger(__name__)

TOKEN_ENV = "AGL_BRIDGE_COLLECT_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_REQUEST_BYTES = 16 * 2**20
TRACES_PATH = "/v1/traces"
LOGS_PATH = "/v1/logs"
GRPC_SERVICE = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name
GRPC_LOGS_SERVICE = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name
# path -> the module that decodes its payloads (looked up at each request: both modules have
# decode_protobuf and decode_json)
_SIGNALS = {TRACES_PATH: otlp, LOGS_PATH: otlp_logs}
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_JSON_TYPE = "application/json"
_STOP_WAIT_S = 10.0


@dataclass
class ReceiverStats:
    """Counters of one receiver; ``spans_written`` are rows handed to the writer."""

    requests: int = 0
    spans_written: int = 0
    spans_rejected: int = 0
    log_records_written: int = 0  # evaluation events, as rows
    log_records_rejected: int = 0
    log_records_ignored: int = 0  # log records that are not events agl-bridge keeps
    requests_malformed: int = 0
    requests_unauthorized: int = 0
    requests_too_large: int = 0
    requests_failed: int = 0

    def summary(self) -> str:
        return (f"{self.requests} request(s) accepted: {self.spans_written} span(s) written, "
                f"{self.spans_rejected} quarantined; refused: {self.requests_malformed} malformed, "
                f"{self.requests_unauthorized} unauthorized, {self.requests_too_large} too large, "
                f"{self.requests_failed} failed to write"
                + (f"; log records: {self.log_records_written} written, "
                   f"{self.log_records_rejected} quarantined, {self.log_records_ignored} ignored "
                   f"(not evaluation events)" if self._any_logs else ""))

    @property
    def _any_logs(self) -> bool:
        return bool(self.log_records_written or self.log_records_rejected
                    or self.log_records_ignored)


class OTLPReceiver:
    """OTLP/HTTP and OTLP/gRPC trace and log receiver writing to ``writer`` (closed by ``stop``).

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
            self._http = _HTTPServer((self.host, self.http_port or 0), self)
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
        for service, path in ((GRPC_SERVICE, TRACES_PATH), (GRPC_LOGS_SERVICE, LOGS_PATH)):
            handler = grpc.unary_unary_rpc_method_handler(
                _ExportService(self, path).Export, response_serializer=_serialize)
            server.add_generic_rpc_handlers(
                (grpc.method_handlers_generic_handler(service, {"Export": handler}),))
        address = self._address(self.grpc_port)
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

    def _address(self, port: int | None) -> str:
        return f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"

    @property
    def http_endpoint(self) -> str | None:
        if self._http is None:
            return None
        return f"http://{self._address(self.http_port)}{TRACES_PATH}"

    @property
    def logs_endpoint(self) -> str | None:
        """Where OTLP/HTTP log records go (evaluation events)."""
        traces = self.http_endpoint
        return traces[:-len(TRACES_PATH)] + LOGS_PATH if traces else None

    @property
    def grpc_endpoint(self) -> str | None:
        return None if self._grpc is None else self._address(self.grpc_port)

    # -- shared by both protocols ------------------------------------------------------------
    def _authorized(self, authorization: str | None) -> bool:
        if self.token is None:
            return True
        scheme, _, credentials = (authorization or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            credentials.strip().encode(), self.token.encode())

    def _count_refused(self, refused: Refused) -> None:
        if refused.status == 400:
            self._count(requests_malformed=1)
        elif refused.status == 413:
            self._count(requests_too_large=1)

    def _count(self, **increments: int) -> None:
        with self._lock:
            for name, n in increments.items():
                setattr(self.stats, name, getattr(self.stats, name) + n)

    @contextlib.contextmanager
    def _in_request(self) -> Iterator[None]:
        with self._lock:
            if self._stopping:
                raise Refused(503, "the receiver is shutting down")
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._lock.notify_all()

    def _ingest(self, decode: Callable[[bytes | bytearray], otlp.Conversion],
                body: bytes | bytearray) -> Any:
        """Decode, write the rows, quarantine the rejects; raise Refused for the error answers."""
        with self._in_request():
            try:
                conversion = decode(body)
            except otlp.MalformedRequest as exc:
                self._count(requests_malformed=1)
                raise Refused(400, str(exc)) from None
            try:
                self.writer.write_rows(conversion.rows)
                if conversion.rejected:
                    self.writer.quarantine(conversion.rejected)
            except Exception as exc:
                logger.exception("agl_bridge: writing %d received %s(s) failed",
                                 len(conversion.rows), conversion.noun)
                self._count(requests_failed=1)
                raise Refused(503, f"writing {conversion.noun}s failed: {exc}") from None
            self._count(requests=1, **conversion.counts())
            return conversion.response()


# -- OTLP/gRPC ---------------------------------------------------------------------------------
def _serialize(response: Any) -> bytes:
    """An Export*ServiceResponse as the bytes gRPC sends."""
    return bytes(response.SerializeToString())


class _ExportService(trace_service_pb2_grpc.TraceServiceServicer):
    """``TraceService/Export`` or ``LogsService/Export`` (the signal of the HTTP ``path``); the
    request arrives as bytes (see ``_start_grpc``)."""

    def __init__(self, receiver: OTLPReceiver, path: str) -> None:
        self.receiver, self.path = receiver, path

    def Export(self, request: bytes, context: grpc.ServicerContext) -> Any:
        rx = self.receiver
        metadata = {m.key: m.value for m in context.invocation_metadata()}
        if not rx._authorized(metadata.get("authorization")):
            rx._count(requests_unauthorized=1)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            return rx._ingest(_SIGNALS[self.path].decode_protobuf, request)
        except Refused as refused:
            error = refused
        except Exception:
            logger.exception("agl_bridge collect: gRPC export failed")
            error = Refused(500, "internal error in the receiver")
        context.abort(grpc.StatusCode[code_pb2.Code.Name(error.rpc_code)], error.message)
        raise AssertionError("unreachable: context.abort raises")


# -- OTLP/HTTP ---------------------------------------------------------------------------------
_MAX_REQUEST_LINE = 65536  # what http.server allows; longer is 414
_MAX_BLANK_LINES = 8  # RFC 9112 2.2: empty lines before a request line are ignored
_REQUEST_LINE = re.compile(
    rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+ [!-~\x80-\xff]+ HTTP/([0-9])\.[0-9]\r?\n")
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_FIELD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # controls; CR LF: obsolete folding
_LINGER_S = 2.0


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # idle keep-alive connections must not hold up stop()

    def __init__(self, address: tuple[str, int], receiver: OTLPReceiver) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.receiver = receiver
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind also resolves the host's FQDN: a DNS lookup we do not need.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that hangs up mid-request is its problem, not a traceback on our stderr
        logger.debug("agl_bridge collect: connection from %s failed", client_address,
                     exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    """One connection. Every request gets a status line and a ``google.rpc.Status`` body.

    ``http.server`` alone stays silent on some malformed requests (a blank request line, an
    HTTP/0.9 one) and trusts what its parser skipped (a field name with a space before the
    colon is read as the start of the body); ``parse_request`` and ``send_error`` close those
    gaps, and ``http_body`` reads the body.
    """

    protocol_version = "HTTP/1.1"  # keep-alive: exporters reuse their connection
    server_version = "agl-bridge-collect"
    timeout = 30  # a client that stops sending mid-body gives its thread back
    server: _HTTPServer
    raw_requestline: bytes
    _body_pending = True  # until the body is read or known to be empty: linger when closing
    _expect_100 = False

    def parse_request(self) -> bool:
        self._body_pending, self._expect_100 = True, False
        line: bytes = self.raw_requestline
        for _ in range(_MAX_BLANK_LINES):
            if line not in (b"\r\n", b"\n"):
                break
            line = self.raw_requestline = self.rfile.readline(_MAX_REQUEST_LINE + 1)
        if not line:  # the client closed without sending a request: nothing to answer
            self.close_connection = True
            return False
        self.requestline = line.decode("latin-1").rstrip("\r\n")
        self.command = None  # type: ignore[assignment]  # no method yet (as http.server does)
        self.request_version = "HTTP/1.1"  # what an answer to a malformed line is written in
        if len(line) > _MAX_REQUEST_LINE:
            self.send_error(414, "request line too long")
            return False
        match = _REQUEST_LINE.fullmatch(line)
        if match is None:
            self.send_error(400, "malformed request line")
            return False
        if match.group(1) != b"1":  # HTTP/0.x would get no status line from http.server
            self.send_error(505, "only HTTP/1.x is served here")
            return False
        if not super().parse_request():
            return False
        problem = _header_problem(self.headers)
        if problem:
            self.send_error(400, problem)
            return False
        return True

    def handle_expect_100(self) -> bool:
        # 100 Continue only once the request is known to be acceptable (see _export): a client
        # told 413 or 401 up front need not send the body at all
        self._expect_100 = True
        return True

    def do_POST(self) -> None:
        is_json = _media_type(self.headers.get("Content-Type")) == _JSON_TYPE
        try:
            response = self._export(self.server.receiver, is_json)
        except Refused as refused:
            self._refuse(refused, is_json)
            return
        except Exception:
            logger.exception("agl_bridge collect: request failed")
            self._refuse(Refused(500, "internal error in the receiver"), is_json)
            return
        if is_json:
            payload = json.dumps(json_format.MessageToDict(response)).encode()
        else:
            payload = response.SerializeToString()
        self._reply(200, payload, is_json)

    def _export(self, rx: OTLPReceiver, is_json: bool) -> Any:
        try:
            path = urlsplit(self.path).path
        except ValueError:
            raise Refused(400, "malformed request target") from None
        if path not in _SIGNALS:
            raise Refused(404, f"no such path {self.path[:200]!r}; traces go to {TRACES_PATH}, "
                               f"logs (evaluation events) to {LOGS_PATH}")
        signal = _SIGNALS[path]
        if not rx._authorized(self.headers.get("Authorization")):
            rx._count(requests_unauthorized=1)
            raise Refused(401, "missing or wrong bearer token")
        media = _media_type(self.headers.get("Content-Type"))
        if media not in (*_PROTOBUF_TYPES, _JSON_TYPE):
            raise Refused(415, f"unsupported Content-Type {media[:80]!r}; use "
                               f"application/x-protobuf or application/json")
        try:
            frame = http_body.framing(self.headers, self.request_version, rx.max_request_bytes)
            self._body_pending = not frame.empty
            if self._expect_100:
                self.send_response_only(100)
                self.end_headers()
            body = http_body.read_body(cast(BinaryIO, self.rfile), frame,
                                       rx.max_request_bytes)
        except Refused as refused:
            rx._count_refused(refused)
            raise
        self._body_pending = False
        return rx._ingest(signal.decode_json if is_json else signal.decode_protobuf, body)

    def send_error(self, code: int, message: str | None = None,
                   explain: str | None = None) -> None:
        """http.server's own refusals (414, 431, 501, 505) answered like ours."""
        self._refuse(Refused(code, message or self.responses.get(code, ("error",))[0]),
                     is_json=False)

    def _refuse(self, refused: Refused, is_json: bool) -> None:
        if self.request_version in ("", "HTTP/0.9"):  # http.server writes no status line then
            self.request_version = "HTTP/1.1"
        self._reply(refused.status, _status_body(refused, is_json), is_json, close=True)
        if self._body_pending:
            self._linger()

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
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _linger(self) -> None:
        """After answering a request whose body was not read: let the client finish sending.

        Closing a socket with unread input makes the kernel reset the connection, and a client
        still sending then sees "connection reset" instead of our 413 or 400. So our side is
        shut after the answer and the input read and dropped until the client closes, for at
        most the size limit in bytes and ``_LINGER_S`` seconds (nothing is kept).
        """
        budget, deadline = self.server.receiver.max_request_bytes, time.monotonic() + _LINGER_S
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            while budget > 0 and (left := deadline - time.monotonic()) > 0:
                self.connection.settimeout(left)
                dropped = self.rfile.read1(min(budget, 2**16))
                if not dropped:
                    return
                budget -= len(dropped)
        except OSError:  # the client is gone, or took too long: either way we are done
            pass

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("agl_bridge collect: " + format, *args)


def _header_problem(headers: Message) -> str | None:
    """Why a parsed header section must be refused (RFC 9112 5), or None.

    ``http.client.parse_headers`` is lenient: a line that is not a field ends the section and
    everything after it (``Content-Length : 5`` included) lands in the payload, with a defect.
    """
    if headers.defects or headers.get_payload():
        return "malformed header section"
    for name, value in headers.items():
        if not _FIELD_NAME.fullmatch(name):
            return f"malformed field name {name[:40]!r}"
        if _BAD_FIELD_VALUE.search(value):
            return f"control character or line folding in field {name[:40]!r}"
    return None


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def _status_body(refused: Refused, is_json: bool) -> bytes:
    status = status_pb2.Status(code=refused.rpc_code, message=refused.message)
    if is_json:
        return json.dumps(json_format.MessageToDict(status)).encode()
    return status.SerializeToString()
