"""``agl-bridge collect`` over raw sockets: HTTP/1.1 framing as RFC 9112 has it, and bounded.

Every request, however malformed, gets a status line and a ``google.rpc.Status`` body before the
connection closes; no body is read or inflated past ``max_request_bytes``; the server keeps
serving. These are the cases an adversarial run broke (issue 14) and their neighbours.
"""

import gzip
import zlib

import pytest
from google.rpc import code_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.otlp_helpers import make_spans, read_rows
from tests.raw_http import exchange, final, parse_responses

LIMIT = 64 * 2**10


def valid_body(name="ok"):
    return encode_spans(make_spans(lambda t: t.start_span(name).end())).SerializeToString()


def request(body=b"", *, headers=(), length=True, version=b"HTTP/1.1",
            content_type=b"application/x-protobuf"):
    head = [b"POST /v1/traces " + version, b"Host: 127.0.0.1",
            b"Content-Type: " + content_type, *headers]
    if length:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def chunked(body, size=7):
    pieces = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
              for i in range(0, len(body), size)]
    return b"".join(pieces) + b"0\r\n\r\n"


def assert_serving(rx, name="after"):
    answer = final(exchange(rx.http_port, request(valid_body(name))))
    assert answer.status == 200, answer


def answer_to(rx, payload, **options):
    answer = final(exchange(rx.http_port, payload, **options))
    assert answer.status == 200 or answer.headers["connection"] == "close"
    if answer.status != 200:
        assert status_pb2.Status.FromString(answer.body).message  # says why
    return answer


@pytest.mark.parametrize("size, status", [
    (b"-1", 400), (b"-0", 400), (b"+10", 400), (b"0x10", 400), (b" 10", 400), (b"1_0", 400),
    ("\uff11\uff10".encode(), 400), (b"1" * 17, 400), (b"f" * 16, 413)])
def test_a_chunk_size_that_is_not_hex_is_answered_before_the_stream_ends(start, size, status):
    """Issue 14 item 5: ``-1`` read the stream to its end (150 MiB) before any answer."""
    rx = start(max_request_bytes=LIMIT)
    endless = (b"x" * 2**20 for _ in range(64))  # 64 MiB, never half-closed: no EOF to wait for
    payload = [request(headers=[b"Transfer-Encoding: chunked"], length=False) + size + b"\r\n",
               *endless]
    answer = answer_to(rx, payload, close_write=False)
    assert answer.status == status
    assert_serving(rx)
    assert rx.stats.requests_malformed + rx.stats.requests_too_large == 1


@pytest.mark.parametrize("value, status", [
    ("\u00b2".encode("latin-1"), 400),  # superscript two: str.isdigit() says yes, int() says no
    ("\u0663".encode(), 400), (b"1" * 5000, 413), (b"9" * 20, 413), (b"+5", 400), (b"-1", 400),
    (b"0x5", 400), (b"5, 5", 400), (b"5 5", 400), (b"", 400)])
def test_a_bad_content_length_gets_an_answer(start, value, status):
    """Issue 14 item 6: a non-ASCII digit or 5,000 digits closed the connection unanswered."""
    rx = start(max_request_bytes=LIMIT)
    answer = answer_to(rx, request(b"hello", headers=[b"Content-Length: " + value],
                                   length=False))
    assert answer.status == status
    assert_serving(rx)


def test_content_length_must_be_one_field_and_may_have_leading_zeros(start, tmp_path):
    rx = start(max_request_bytes=LIMIT)
    body = valid_body("zeros")
    twice = request(body, headers=[b"Content-Length: %d" % len(body)])
    assert answer_to(rx, twice).status == 400
    padded = request(body, headers=[b"Content-Length: %030d" % len(body)], length=False)
    assert answer_to(rx, padded).status == 200
    assert answer_to(rx, request(body, length=False)).status == 411
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["zeros"]


def bombs(body):
    """(what, Content-Encoding, encoded body, chunked): each inflates far past LIMIT."""
    zeros = b"\0" * (64 * 2**20)
    gz = gzip.compress(zeros, compresslevel=9)
    raw = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return [
        ("gzip", b"gzip", gz, False),
        ("gzip, chunked", b"gzip", gz, True),
        ("a valid member, then a bomb member", b"gzip", gzip.compress(body) + gz, False),
        ("zlib", b"deflate", zlib.compress(zeros, 9), False),
        ("raw deflate", b"deflate", raw.compress(zeros) + raw.flush(), False),
    ]


def test_a_gzip_bomb_is_refused_and_nothing_of_it_written(start, tmp_path):
    """Decoded size is bounded across all of a body: every gzip member, every coding."""
    rx = start(max_request_bytes=LIMIT)
    body = valid_body("inside-a-bomb")
    for what, coding, encoded, is_chunked in bombs(body):
        assert len(encoded) < LIMIT, what  # small on the wire
        headers = [b"Content-Encoding: " + coding]
        payload = request(chunked(encoded, 4096), headers=[*headers, b"Transfer-Encoding: chunked"],
                          length=False) if is_chunked else request(encoded, headers=headers)
        answer = answer_to(rx, payload)
        assert answer.status == 413, what
        assert status_pb2.Status.FromString(answer.body).code == code_pb2.RESOURCE_EXHAUSTED
    # a member followed by something that is not one is not silently cut off either
    assert answer_to(rx, request(gzip.compress(body) + b"garbage",
                                 headers=[b"Content-Encoding: gzip"])).status == 400
    two_members = gzip.compress(body[:10]) + gzip.compress(body[10:])
    assert answer_to(rx, request(two_members, headers=[b"Content-Encoding: gzip"])).status == 200
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["inside-a-bomb"]  # the 200 only
    assert rx.stats.requests_too_large == 5 and rx.stats.requests_malformed == 1


@pytest.mark.parametrize("headers, version, status", [
    ([b"Transfer-Encoding: chunked"], b"HTTP/1.1", 200),
    ([b"Transfer-Encoding: Chunked"], b"HTTP/1.1", 200),
    ([b"Transfer-Encoding: ,chunked"], b"HTTP/1.1", 200),  # empty list elements are ignored
    ([b"Transfer-Encoding: gzip, chunked"], b"HTTP/1.1", 501),
    ([b"Transfer-Encoding: x-custom", b"Transfer-Encoding: chunked"], b"HTTP/1.1", 501),
    ([b"Transfer-Encoding: chunked, gzip"], b"HTTP/1.1", 400),
    ([b"Transfer-Encoding: chunked, chunked"], b"HTTP/1.1", 400),
    ([b"Transfer-Encoding: identity"], b"HTTP/1.1", 400),
    ([b"Transfer-Encoding: chunked", b"Content-Length: 5"], b"HTTP/1.1", 400),
    ([b"Transfer-Encoding: chunked"], b"HTTP/1.0", 400),
    ([b"Transfer-Encoding: chunked", b"Content-Encoding: br"], b"HTTP/1.1", 415),
    ([b"Transfer-Encoding: chunked", b"Content-Encoding: gzip, gzip"], b"HTTP/1.1", 415),
])
def test_transfer_codings_as_rfc_9112_has_them(start, headers, version, status):
    rx = start(max_request_bytes=LIMIT)
    payload = request(chunked(valid_body()), headers=headers, length=False, version=version)
    assert answer_to(rx, payload).status == status
    assert_serving(rx)


def test_chunk_extensions_and_trailers_are_read_strictly_and_bounded(start, tmp_path):
    rx = start(max_request_bytes=LIMIT)
    body = valid_body("chunked")
    te = [b"Transfer-Encoding: chunked"]

    def post(framed):
        return answer_to(rx, request(framed, headers=te, length=False)).status

    fine = b'%x;ext;name=value;q="quoted \\" pair"\r\n%s\r\n0;last\r\nX-Trailer: 1\r\n\r\n'
    assert post(fine % (len(body), body)) == 200
    assert post(b"%x;%s\r\n%s\r\n0\r\n\r\n" % (len(body), b"e" * 5000, body)) == 400
    assert post(b"%x\r\n%s\r\n0\r\n%s\r\n" % (len(body), body, b"T: 1\r\n" * 33)) == 400
    assert post(b"%x\r\n%s\r\n0\r\nnot a field\r\n\r\n" % (len(body), body)) == 400
    assert post(b"%x\r\n%sXY0\r\n\r\n" % (len(body), body)) == 400  # no CRLF after the data
    assert post(b"%x\n%s\r\n0\r\n\r\n" % (len(body), body)) == 400  # bare LF
    assert post(b"%x\r\n%s\r\n" % (len(body), body)) == 400  # no last chunk: cut short
    # small once decoded, over the limit on the wire: 1-byte chunks with long extensions
    framing_heavy = b"".join(b"1;%s\r\nx\r\n" % (b"e" * 1000) for _ in range(LIMIT // 500))
    assert post(framing_heavy + b"0\r\n\r\n") == 413
    rx.stop()
    assert [r["name"] for r in read_rows(tmp_path / "out")] == ["chunked"]
    assert rx.stats.requests_too_large == 1 and rx.stats.requests_malformed == 6


@pytest.mark.parametrize("payload, status", [
    (b"POST /v1/traces\r\n\r\n", 400),  # HTTP/0.9 form: http.server wrote no status line
    (b"GET /v1/traces\r\n\r\n", 400),
    (b" \r\n\r\n", 400),
    (b"GARBAGE\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/2.0\r\n\r\n", 505),
    (b"POST /v1/traces HTTP/0.9\r\nContent-Length: 0\r\n\r\n", 505),  # was: no status line
    (b"POST /v1/traces HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello", 400),
    (b"POST /v1/traces HTTP/1.1\r\nX-Folded: a\r\n b\r\nContent-Length: 0\r\n\r\n", 400),
    (b"POST /v1/traces HTTP/1.1\r\nX-Nul: a\x00b\r\nContent-Length: 0\r\n\r\n", 400),
    (b"POST http://[/v1/traces HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),
    (b"GET /v1/traces HTTP/1.1\r\n\r\n", 501),
    (b"POST /v1/traces HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431),
    (b"POST /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414),
])
def test_malformed_request_heads_get_a_status_line(start, payload, status):
    rx = start(max_request_bytes=LIMIT)
    assert answer_to(rx, payload).status == status
    assert_serving(rx)


def test_empty_lines_before_a_request_are_ignored(start):
    rx = start(max_request_bytes=LIMIT)
    assert answer_to(rx, b"\r\n\r\n" + request(valid_body())).status == 200


def test_100_continue_is_sent_only_for_a_request_that_will_be_read(start):
    rx = start(max_request_bytes=LIMIT)
    expect = [b"Expect: 100-continue"]
    too_large = request(headers=[*expect, b"Content-Length: %d" % (LIMIT + 1)], length=False)
    assert [r.status for r in parse_responses(exchange(rx.http_port, too_large))] == [413]
    wrong_type = request(valid_body(), headers=expect, content_type=b"text/plain")
    assert [r.status for r in parse_responses(exchange(rx.http_port, wrong_type))] == [415]
    fine = request(valid_body(), headers=[*expect, b"Connection: close"])
    assert [r.status for r in parse_responses(exchange(rx.http_port, fine))] == [100, 200]
