"""Seeded payload generators for fuzzing ``agl-bridge collect``, and the receiver process they hit.

Three kinds of payload, all built from valid OTLP requests by a ``random.Random(seed)``:

* ``framing``: an HTTP/1.1 request whose request line, header fields, ``Content-Length``,
  ``Transfer-Encoding``, chunking, ``Content-Type``, ``Content-Encoding`` or raw bytes are
  mutated (one to three mutations each), sent as bytes over a raw socket;
* ``body``: a correctly framed request whose OTLP body (protobuf or OTLP/JSON, sometimes gzipped
  or chunked) is mutated: bytes flipped, cut, repeated, spliced; JSON values swapped for values of
  the wrong type, the wrong size or the wrong depth;
* ``grpc``: mutated protobuf messages, oversized and compressed ones, odd metadata and unknown
  methods through a real gRPC channel, and garbage bytes on the gRPC port.

``python otlp_fuzz.py OUT LIMIT`` runs the receiver on free ports, prints them as JSON, then
answers ``peak`` (its peak RSS so far) and ``stop`` (stop, print the stats) on stdin: its memory
is then its own, not the test's.
"""

from __future__ import annotations

import base64
import copy
import gzip
import json
import random
import resource
import sys
import zlib
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ALLOWED_HTTP = {200, 400, 404, 411, 413, 414, 415, 431, 501, 505}
_TOKEN_CHARS = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


# -- an HTTP request as parts, rendered to bytes ----------------------------------------------
@dataclass
class Request:
    body: bytes  # the OTLP payload before content coding
    content_type: bytes = b"application/x-protobuf"
    method: bytes = b"POST"
    target: bytes = b"/v1/traces"
    version: bytes = b"HTTP/1.1"
    fields: list[bytes] = field(default_factory=list)  # extra header lines, as sent
    coding: bytes | None = None  # Content-Encoding sent
    encoded: bytes | None = None  # the body as sent, when a coding made it differ
    chunks: bytes | None = None  # the framed body when chunked
    length: bytes | None = None  # Content-Length sent, when not the true one
    framing: str = "length"  # "length", "chunked", "both" or "none"

    def render(self) -> bytes:
        data = self.encoded if self.encoded is not None else self.body
        head = [b" ".join(x for x in (self.method, self.target, self.version) if x),
                b"Host: 127.0.0.1", b"Content-Type: " + self.content_type]
        if self.coding is not None:
            head.append(b"Content-Encoding: " + self.coding)
        if self.framing in ("chunked", "both"):
            head.append(b"Transfer-Encoding: chunked")
        if self.framing in ("length", "both"):
            head.append(b"Content-Length: " + (self.length if self.length is not None
                                               else b"%d" % len(data)))
        head += self.fields
        framed = self.chunks if self.chunks is not None else (
            chunk(data, [len(data)]) if self.framing == "chunked" else data)
        return b"\r\n".join(head) + b"\r\n\r\n" + framed


def chunk(data: bytes, sizes: list[int], size_text=lambda n: b"%x" % n, ext=b"",
          trailers: bytes = b"", eol: bytes = b"\r\n", last: bool = True) -> bytes:
    """``data`` in chunks of ``sizes`` (the rest in one more); every part of the framing can be
    swapped for a wrong one: the size's text, an extension, the trailers, the line ending, and
    the last chunk left out."""
    out, pos = bytearray(), 0
    for n in sizes:
        piece = data[pos:pos + n]
        pos += n
        if piece:
            out += size_text(len(piece)) + ext + eol + piece + eol
    if pos < len(data):
        out += size_text(len(data) - pos) + eol + data[pos:] + eol
    if last:
        out += b"0" + eol + trailers + eol
    return bytes(out)


def gzip_bomb(size: int) -> bytes:
    """gzip of ``size`` zero bytes, made without holding them: small on the wire, huge inflated."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(2**20)
    return b"".join(z.compress(block) for _ in range(size // len(block))) + z.flush()


# -- framing mutations: each changes one aspect of a Request ----------------------------------
def _content_length(rng: random.Random, r: Request) -> None:
    r.framing = rng.choice(["length", "length", "both"])
    r.length = rng.choice([
        b"-1", b"+5", b"0x10", b" ", b"", b"1" * rng.randint(20, 6000), b"\xc2\xb2", b"\xb2",
        "\u0663\u0664".encode(), b"5, 5", b"1 2", b"%d" % (len(r.body) + rng.randint(1, 50)),
        b"%d" % max(0, len(r.body) - rng.randint(1, 50)), b"0" * rng.randint(1, 40) + b"7",
        b"99999999999999999999999", b"1e3", b"%d" % 2**63, b"\x00"])


def _transfer_encoding(rng: random.Random, r: Request) -> None:
    codings = rng.choices([b"chunked", b"Chunked", b"gzip", b"identity", b"x-custom", b"",
                           b"chunked;a=b", b"deflate", b" chunked ", b"compress"],
                          k=rng.randint(1, 3))
    r.fields.append(b"Transfer-Encoding: " + rng.choice([b",", b", ", b" ,"]).join(codings))
    r.framing = rng.choice(["none", "none", "length"])
    r.chunks = chunk(r.encoded or r.body, [rng.randint(1, 300)] * 40)


def _chunking(rng: random.Random, r: Request) -> None:
    r.framing = "chunked"
    data = r.encoded or r.body
    sizes = [rng.randint(1, max(1, len(data) // 3)) for _ in range(rng.randint(1, 8))]
    fmt = rng.choice([
        lambda n: b"%x" % n, lambda n: b"%X" % n, lambda n: b"%020x" % n, lambda n: b"-%x" % n,
        lambda n: b"0x%x" % n, lambda n: b"+%x" % n, lambda n: b" %x " % n, lambda n: b"-1",
        lambda n: b"%x" % (n + rng.randint(1, 9)), lambda n: b"%x" % max(0, n - 3),
        lambda n: b"f" * rng.randint(16, 40), lambda n: b"%x_0" % n,
        lambda n: "\uff11".encode(), lambda n: b"%d" % n])
    ext = rng.choice([b"", b";a", b";a=b", b';a="q"', b";" + b"e" * rng.randint(100, 6000),
                      b"; a = b", b";=", b";a=\x01", b"\x00"])
    trailers = rng.choice([b"", b"X-T: 1\r\n", b"X-T: 1\r\n" * rng.randint(30, 40),
                           b"no colon\r\n", b"X: " + b"v" * 5000 + b"\r\n", b"\x00: 1\r\n"])
    r.chunks = chunk(data, sizes, fmt, ext, trailers, rng.choice([b"\r\n", b"\r\n", b"\n"]),
                     last=rng.random() < 0.8)


def _header_noise(rng: random.Random, r: Request) -> None:
    name = "".join(rng.choices(_TOKEN_CHARS, k=rng.randint(1, 20))).encode()
    r.fields += rng.choice([
        [name + b": " + bytes(rng.randint(32, 126) for _ in range(rng.randint(0, 40)))],
        [b"Bad Name: x"], [b"X-Colon : x"], [b": empty-name"], [b"no-colon-at-all"],
        [b"X-Fold: a", b"  folded"], [b"X-Ctl: a\x01b"], [b"X-Nul: \x00"],
        [b"X-Long: " + b"a" * rng.choice([8000, 70_000])], [b"X-%d: v" % i for i in range(150)],
        [b"X-Latin: \xe9\xff"], ["X-Utf8: \u2713".encode()], [b"Connection: close"],
        [b"Connection: keep-alive"], [b"Expect: 100-continue"], [b"Expect: bogus"],
        [b"Content-Type: application/json"], [b"Authorization: Bearer x"], [b"Host: a", b"Host: b"],
    ])


def _content_type(rng: random.Random, r: Request) -> None:
    r.content_type = rng.choice([
        b"application/json", b"APPLICATION/X-PROTOBUF", b"application/protobuf",
        b"application/x-protobuf; charset=utf-8", b"text/plain", b"", b"application/",
        b"application/json;;;", b"multipart/form-data; boundary=x", b"\xff\xfe"])


def _content_encoding(rng: random.Random, r: Request) -> None:
    gz = gzip.compress(r.body, mtime=0)
    r.coding, r.encoded = rng.choice([
        (b"gzip", gz), (b"GZIP", gz), (b"x-gzip", gz), (b"gzip", gz[:len(gz) // 2]),
        (b"gzip", gz + gz), (b"gzip", gz + b"trailing"), (b"gzip", r.body),
        (b"deflate", zlib.compress(r.body)), (b"deflate", zlib.compress(r.body)[2:-4]),
        (b"br", r.body), (b"gzip, gzip", gzip.compress(gz, mtime=0)), (b"identity", r.body),
        (b"gzip", b"\x1f\x8b" + bytes(rng.randrange(256) for _ in range(40))),
        (b"gzip", gzip_bomb(rng.choice([1, 4]) * 2**20)), (b"", r.body)])


def _request_line(rng: random.Random, r: Request) -> None:
    choice = rng.randrange(3)
    if choice == 0:
        r.method = rng.choice([b"GET", b"PUT", b"post", b"DELETE", b"OPTIONS", b"P\x00ST",
                               b"", b"POST POST", b"\xff"])
    elif choice == 1:
        r.target = rng.choice([
            b"/v1/traces?x=1", b"/v1/traces/", b"//v1/traces", b"http://h/v1/traces", b"*",
            b"/v1/logs", b"http://[/v1/traces", b"/v1/%00", b"", b"/" + b"a" * 70_000,
            b"/v1/tr aces", "/\u2713".encode()])
    else:
        r.version = rng.choice([b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.10", b"HTTP/x", b"",
                                b"http/1.1", b"HTTP/1.1 extra", b"HTTP/0.9", b"HTTP/1.1\x00"])


_MUTATIONS = [_content_length, _transfer_encoding, _chunking, _header_noise, _content_type,
              _content_encoding, _request_line]


def _bytes_level(rng: random.Random, payload: bytes) -> bytes:
    """Raw damage to a rendered request: the head mostly, since the body has its own fuzz."""
    head_end = max(1, payload.find(b"\r\n\r\n"))
    data = bytearray(payload)
    for _ in range(rng.randint(1, 4)):
        op, at = rng.randrange(5), rng.randrange(1, head_end + 4)
        if op == 0:
            data[at:at + 1] = bytes([rng.randrange(256)])
        elif op == 1:
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2:
            del data[at:at + rng.randint(1, 8)]
        elif op == 3:
            data[at:at] = rng.choice([b"\r\n", b"\n", b"\r", b" ", b"\t", b":"])
        else:
            return bytes(data[:rng.randint(1, len(data))])  # cut short
    return bytes(data)


def framing_case(rng: random.Random, body: bytes, json_body: bytes) -> bytes:
    r = Request(json_body, b"application/json") if rng.random() < 0.3 else Request(body)
    for mutate in rng.sample(_MUTATIONS, rng.randint(1, 3)):
        mutate(rng, r)
    payload = r.render()
    roll = rng.random()
    if roll < 0.2:
        payload = _bytes_level(rng, payload)
    elif roll < 0.27:
        payload = b"\r\n" * rng.randint(1, 12) + payload
    elif roll < 0.35:
        payload += Request(body).render()  # pipelined: the second must be answered too, or not
    return payload


# -- OTLP body mutations ----------------------------------------------------------------------
def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        if not out:
            out += bytes([rng.randrange(256)])
        op, at = rng.randrange(7), rng.randrange(len(out))
        if op == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif op == 1:
            out[at] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif op == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3:
            del out[at:at + rng.randint(1, 64)]
        elif op == 4:
            end = min(len(out), at + rng.randint(1, 256))
            out[at:at] = out[at:end] * rng.randint(1, 8)
        elif op == 5:
            out[at:at] = b"\xff\xff\xff\xff\x0f"  # a varint length of 4 GiB
        else:
            del out[rng.randint(1, len(out)):]
    return bytes(out)


_ODD_VALUES = [None, -1, 0, 2**64, -(2**63) - 1, 1e308, "", "zz", "A" * 40, [], {}, True,
               [[[[[[[[[[[1]]]]]]]]]]], {"a": {"b": {"c": {}}}}, "\u0000", "\ud7ff", 3.5]


def mutate_json(rng: random.Random, obj: object) -> bytes:
    """OTLP/JSON with values swapped for the wrong type, size or depth; or its text damaged."""
    if rng.random() < 0.35:
        return mutate_bytes(rng, json.dumps(obj).encode())
    obj = copy.deepcopy(obj)
    for _ in range(rng.randint(1, 4)):
        holder, key = _random_slot(rng, obj)
        if holder is None:
            continue
        roll = rng.random()
        if roll < 0.6:
            holder[key] = copy.deepcopy(rng.choice(_ODD_VALUES))  # later mutations edit it
        elif roll < 0.8 and isinstance(holder, dict):
            del holder[key]
        else:  # deep, but within what json.dumps here can write (the server gets deeper below)
            depth = rng.choice([50, 200, 500])
            holder[key] = json.loads("[" * depth + "]" * depth)
    text = json.dumps(obj)
    if rng.random() < 0.1:
        depth = rng.choice([2000, 100_000])
        text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    return text.encode()


def _random_slot(rng: random.Random, obj: object) -> tuple[object, object]:
    holder, key = None, None
    node = obj
    for _ in range(rng.randint(1, 12)):
        if isinstance(node, dict) and node:
            k = rng.choice(list(node))
        elif isinstance(node, list) and node:
            k = rng.randrange(len(node))
        else:
            break
        holder, key, node = node, k, node[k]
    return holder, key


def body_case(rng: random.Random, body: bytes, json_obj: object) -> bytes:
    if rng.random() < 0.5:
        r = Request(mutate_bytes(rng, body))
    else:
        r = Request(mutate_json(rng, json_obj), b"application/json")
    if rng.random() < 0.2:
        r.coding, r.encoded = b"gzip", gzip.compress(r.body, mtime=0)
    if rng.random() < 0.2:
        r.framing = "chunked"
        r.chunks = chunk(r.encoded or r.body, [rng.randint(1, 4096)] * 64)
    return r.render()


def deep_protobuf(depth: int) -> bytes:
    """A request whose one attribute is an array nested ``depth`` deep (protobuf's limit: 100)."""
    value = b""
    for _ in range(depth):
        inner = b"\x0a" + _varint(len(value)) + value  # ArrayValue.values = AnyValue
        value = b"\x2a" + _varint(len(inner)) + inner  # AnyValue.array_value = 5
    kv = b"\x0a\x01k\x12" + _varint(len(value)) + value
    span = (b"\x0a\x10" + bytes(range(1, 17)) + b"\x12\x08" + bytes(range(1, 9)) +
            b"\x2a\x01s\x4a" + _varint(len(kv)) + kv)
    scope = b"\x12" + _varint(len(span)) + span
    rs = b"\x12" + _varint(len(scope)) + scope
    return b"\x0a" + _varint(len(rs)) + rs


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


# -- valid requests, each with one span of its own name ---------------------------------------
def named_request(template: ExportTraceServiceRequest, name: str,
                  rng: random.Random) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    request.CopyFrom(template)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.name, span.span_id = name, rng.randbytes(7) + b"\x01"
    return request


def fixed_ids(request: ExportTraceServiceRequest) -> ExportTraceServiceRequest:
    """The same request with ids and times that do not change from run to run (the SDK's do)."""
    ids: dict[bytes, bytes] = {}
    for rs in request.resource_spans:
        for kv in rs.resource.attributes:
            if kv.key == "service.instance.id":  # a fresh uuid in each process
                kv.value.string_value = "fuzz"
        for ss in rs.scope_spans:
            for i, span in enumerate(ss.spans):
                span.trace_id = bytes(range(1, 17))
                span.span_id = ids.setdefault(span.span_id, (len(ids) + 1).to_bytes(8, "big"))
                if span.parent_span_id:
                    span.parent_span_id = ids.setdefault(span.parent_span_id,
                                                         (len(ids) + 1).to_bytes(8, "big"))
                span.start_time_unix_nano = 10**18 + i
                span.end_time_unix_nano = 10**18 + i + 1
                for event in span.events:
                    event.time_unix_nano = 10**18
                for link in span.links:
                    link.trace_id = bytes(range(1, 17))
                    link.span_id = ids.setdefault(link.span_id, (len(ids) + 1).to_bytes(8, "big"))
    return request


def hex_ids(obj: dict) -> dict:
    """Proto3 JSON (base64 ids) -> OTLP/JSON (hex ids)."""
    for rs in obj.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for holder in (span, *span.get("links", ())):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in holder:
                            holder[key] = base64.b64decode(holder[key]).hex()
    return obj


# -- the receiver under test, in a process of its own -----------------------------------------
def _peak_kib() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes there, KiB on Linux


def serve(out: str, limit: int) -> None:
    from agl_bridge.otel import SpanParquetWriter
    from agl_bridge.otel.receiver import OTLPReceiver

    rx = OTLPReceiver(SpanParquetWriter(out), http_port=0, grpc_port=0,
                      max_request_bytes=limit).start()
    print(json.dumps({"http": rx.http_port, "grpc": rx.grpc_port}), flush=True)
    for line in sys.stdin:
        if line.strip() == "peak":
            print(json.dumps({"peak_kib": _peak_kib()}), flush=True)
        elif line.strip() == "stop":
            break
    rx.stop()
    print(json.dumps({"peak_kib": _peak_kib(), "stats": vars(rx.stats)}), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
