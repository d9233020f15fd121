"""Streams (``stream=True``, sync and async): the SDK's stream, wrapped in a proxy that records
each chunk as it passes and ends the span exactly once.

The span ends when the stream is exhausted, raises, is closed (``close()``, ``with``/``async
with`` exit, an early ``break`` then close) or is garbage collected: a stream the caller drops
must not leave an open span behind. vLLM 0.32 streams the ids like this (observed on a real
server):

* the first chunk of each choice (the ``role`` delta) carries the top-level
  ``prompt_token_ids`` (a list when asked, ``null`` when not) and ``prompt_text: null``;
  its choice has no ``token_ids`` key;
* every later chunk's choice carries ``token_ids``: the ids of that chunk's tokens when asked,
  ``null`` when not; its ``logprobs`` is ``{"content": [...]}`` when asked, ``null`` when not;
* with ``stream_options.include_usage`` a last chunk has ``choices: []`` and the usage.

For ``n > 1`` the ids and logprobs are choice 0's; the finish reasons are every choice's.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry import trace
from wrapt import ObjectProxy

from agl_bridge.errors import record_error

from . import raw
from .raw import Take
from .request import Call
from .response import Choice, common_attributes, reasoning_of, record
from .utils import extra

logger = logging.getLogger(__name__)

_activate, _deactivate = raw._active.set, raw._active.reset  # per chunk: bound once


class StreamRecorder:
    """Accumulates a stream's chunks and ends its span exactly once."""

    def __init__(self, span: trace.Span, call: Call) -> None:
        self.span = span
        self.call = call
        self.response_id: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        # the ids and logprobs: read from each chunk's JSON by the call's take (``raw.py``),
        # or from the chunk's models when the take could not read it
        self.ids = call.take if call.take is not None else Take(call)
        self.choices: dict[int, Choice] = {}
        self._ended = False
        self._lock = threading.Lock()

    def process(self, chunk: Any, absorbed: bool = False) -> None:
        """Record one chunk, then reset in it what the caller did not ask for (``absorbed``:
        its ids were read and reset in its JSON already)."""
        try:
            self._accumulate(chunk, absorbed)
        except Exception:  # never let recording break the caller's stream
            logger.debug("agl_bridge: could not record a stream chunk", exc_info=True)
        if absorbed:
            return
        call = self.call
        choices = getattr(chunk, "choices", None) or ()
        if call.injected_ids:
            if extra(chunk).get("prompt_token_ids") is not None:
                chunk.prompt_token_ids = None
            for choice in choices:
                if extra(choice).get("token_ids") is not None:
                    choice.token_ids = None
        if call.injected_logprobs:
            for choice in choices:
                if getattr(choice, "logprobs", None) is not None:
                    choice.logprobs = None

    def _accumulate(self, chunk: Any, absorbed: bool) -> None:
        if self.response_id is None and getattr(chunk, "id", None):
            self.response_id = chunk.id
        if self.model is None and getattr(chunk, "model", None):
            self.model = chunk.model
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        call = self.call
        ids = self.ids
        read_ids = call.ids and not absorbed
        if read_ids and ids.prompt_ids is None:
            prompt_ids = extra(chunk).get("prompt_token_ids")
            if prompt_ids is not None:
                ids.prompt_ids = list(prompt_ids)
        for choice in getattr(chunk, "choices", None) or ():
            index = getattr(choice, "index", 0) or 0
            acc = self.choices.get(index)
            if acc is None:
                acc = self.choices[index] = Choice(index)
            if getattr(choice, "finish_reason", None):
                acc.finish_reason = choice.finish_reason
            if read_ids and index == 0:
                token_ids = extra(choice).get("token_ids")
                if token_ids is not None:
                    if ids.completion_ids is None:
                        ids.completion_ids = []
                    ids.completion_ids.extend(token_ids)
                content = getattr(getattr(choice, "logprobs", None), "content", None)
                if content:
                    ids.logprobs.extend(float(t.logprob) for t in content)
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            if call.messages:
                if getattr(delta, "content", None):
                    acc.text.append(delta.content)
                reasoning = reasoning_of(delta)
                if reasoning:
                    acc.reasoning.append(reasoning)
                legacy = getattr(delta, "function_call", None)
                if legacy is not None:
                    if acc.legacy_call is None:
                        acc.legacy_call = {"name": None, "arguments": []}
                    if legacy.name:
                        acc.legacy_call["name"] = legacy.name
                    if legacy.arguments:
                        acc.legacy_call["arguments"].append(legacy.arguments)
            if call.ids:
                for tc in getattr(delta, "tool_calls", None) or ():
                    slot = acc.tool_calls.get(tc.index)
                    if slot is None:
                        slot = acc.tool_calls[tc.index] = {"id": None, "name": None,
                                                           "arguments": []}
                    if tc.id:
                        slot["id"] = tc.id
                    fn = getattr(tc, "function", None)
                    if fn is not None:
                        if fn.name:
                            slot["name"] = fn.name
                        if fn.arguments and call.messages:
                            slot["arguments"].append(fn.arguments)

    def end(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if self._ended:
                return
            self._ended = True
        span, call, ids = self.span, self.call, self.ids
        try:
            attrs = common_attributes(call, response_id=self.response_id, model=self.model,
                                      choices=list(self.choices.values()), usage=self.usage)
            completion = ids.completion_ids
            if completion is None and ids.prompt_ids is not None:
                completion = []  # the stream stopped before choice 0 sent a token
            record(span, call, attrs, ids.prompt_ids, completion, ids.logprobs)
            if exc is not None:
                record_error(span, exc, level=call.level)
        except Exception:
            logger.debug("agl_bridge: could not record a stream", exc_info=True)
        finally:
            span.end()


class _RecordingProxy(ObjectProxy):
    """A stream with its recorder. One the caller drops unfinished still ends its span, when it
    is collected."""

    def __init__(self, wrapped: Any, recorder: StreamRecorder) -> None:
        super().__init__(wrapped)
        self._self_recorder = recorder

    def __del__(self) -> None:
        recorder = getattr(self, "_self_recorder", None)
        if recorder is not None:
            try:
                recorder.end()
            except Exception:  # pragma: no cover - e.g. at interpreter shutdown
                pass


class StreamProxy(_RecordingProxy):
    """The SDK's ``Stream`` as the caller knows it, recording each chunk on the span."""

    def __iter__(self):
        return self

    def __next__(self):
        recorder = self._self_recorder
        take = recorder.call.take
        if take is not None:
            before = take.absorbed
            token = _activate(take)  # raw.activate, without a Python call a chunk
        try:
            chunk = self.__wrapped__.__next__()
        except StopIteration:
            recorder.end()
            raise
        except BaseException as exc:
            recorder.end(exc)
            raise
        finally:
            if take is not None:
                _deactivate(token)
        recorder.process(chunk, take is not None and take.absorbed != before)
        return chunk

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()

    def close(self) -> None:
        try:
            self.__wrapped__.close()
        finally:
            self._self_recorder.end()


class AsyncStreamProxy(_RecordingProxy):
    """The SDK's ``AsyncStream`` as the caller knows it, recording each chunk on the span."""

    def __aiter__(self):
        return self

    async def __anext__(self):
        recorder = self._self_recorder
        take = recorder.call.take
        if take is not None:
            before = take.absorbed
            token = _activate(take)  # raw.activate, without a Python call a chunk
        try:
            chunk = await self.__wrapped__.__anext__()
        except StopAsyncIteration:
            recorder.end()
            raise
        except BaseException as exc:
            recorder.end(exc)
            raise
        finally:
            if take is not None:
                _deactivate(token)
        recorder.process(chunk, take is not None and take.absorbed != before)
        return chunk

    async def __aenter__(self):
        return self

    async def __aexit__(self, exc_type, exc, tb):
        await self.close()

    async def close(self) -> None:
        try:
            await self.__wrapped__.close()
        finally:
            self._self_recorder.end()

    async def aclose(self) -> None:
        await self.close()
