"""Token ids and logprobs taken from the server's JSON before the openai SDK builds models of it.

Why: vLLM's answer to a call that asks for ids carries the prompt's ids, the completion's ids
and, per completion token, a logprobs entry (token text, bytes, alternatives). The SDK builds
pydantic models of every entry, in Python, although the caller never asked for them and we reset
them anyway; with the SDK's per-element attribute checks that was most of what recording ids cost
per call (``benchmarks/capture_overhead.py``). The SDK hands every decoded JSON body, a whole
response or one stream chunk, to ``BaseClient._process_response_data``. A wrapper there
(``install``) lets the ``Take`` active in the current context read the ids and logprob numbers
out of the dict and reset the fields it asked for on the caller's behalf to what the server
sends when nobody asks (null), before any model is built.

A ``Take`` is active only around the SDK work of one traced call (``activate``): the tracing
wrapper around ``create``, the stream proxies around each ``next()``, a raw response's
``parse()``. Everything else the SDK parses passes through untouched. A body the take cannot
read is left as it is and not counted (``absorbed``), so the response side reads that one from
the models as before; so does everything when the SDK has no such method.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar, Token
from typing import Any, Protocol

from wrapt import wrap_function_wrapper

logger = logging.getLogger(__name__)

_NAME = "_process_response_data"
_METHOD = f"openai._base_client.BaseClient.{_NAME}"

_active: ContextVar[Take | None] = ContextVar("agl_bridge_openai_take", default=None)


class Asked(Protocol):
    """What a ``Take`` reads of its call: what was asked for (``request.Call`` is one; this
    module does not import it, since the call holds its take)."""

    @property
    def stream(self) -> bool: ...
    @property
    def ids(self) -> bool: ...
    @property
    def branch(self) -> object: ...
    @property
    def injected_ids(self) -> bool: ...
    @property
    def injected_logprobs(self) -> bool: ...


class Take:
    """What one call's bodies held: prompt ids, choice 0's completion ids and logprobs."""

    __slots__ = ("absorbed", "call", "choices", "completion_ids", "logprobs", "prompt_ids")

    def __init__(self, call: Asked) -> None:
        self.call = call
        self.absorbed = 0  # bodies read (a response: 1; a stream: one per chunk so far)
        self.prompt_ids: list[Any] | None = None
        self.completion_ids: list[Any] | None = None
        self.logprobs: list[float] = []
        # a branched call (``call.branch``, never a stream): choice index -> (ids, logprobs)
        self.choices: dict[int, tuple[list[Any] | None, list[float] | None]] = {}

    def absorb(self, data: dict[str, Any]) -> None:
        """Read one body, then reset in it what the caller did not ask for.

        Reading comes first and may fail on a malformed body: then nothing is changed and the
        body is not counted. Resetting cannot fail.
        """
        call = self.call
        choices = data.get("choices")
        if type(choices) is not list:
            return
        if call.stream:
            self._absorb_chunk(data, choices, call)
            return
        prompt = completion = content = None
        if call.ids and not self.absorbed:  # a response's first parse only
            prompt = data.get("prompt_token_ids")
            if type(prompt) is not list:
                prompt = None
            first = None
            for choice in choices:
                if type(choice) is dict:  # the first choice, when it is one
                    first = choice
                break
            if first is not None:
                completion = first.get("token_ids")
                if type(completion) is not list:
                    completion = None
                lp = first.get("logprobs")
                entries = lp.get("content") if type(lp) is dict else None
                if entries:
                    content = [float(entry["logprob"]) for entry in entries]
        branched = None
        if call.branch is not None and call.ids and not self.absorbed:
            branched = {}
            for position, choice in enumerate(choices):
                if type(choice) is not dict:
                    continue
                ids = choice.get("token_ids")
                lp = choice.get("logprobs")
                entries = lp.get("content") if type(lp) is dict else None
                branched[choice.get("index", position)] = (
                    ids if type(ids) is list else None,
                    [float(entry["logprob"]) for entry in entries] if entries else None)
        if branched is not None:
            self.choices = branched
        if prompt is not None and self.prompt_ids is None:
            self.prompt_ids = prompt
        if completion is not None:
            if self.completion_ids is None:
                self.completion_ids = completion
            else:
                self.completion_ids.extend(completion)
        if content:
            self.logprobs.extend(content)
        self.absorbed += 1
        _reset(data, choices, call)

    def _absorb_chunk(self, data: dict[str, Any], choices: list[Any], call: Asked) -> None:
        """``absorb`` for one stream chunk, its hot path: a stream has one per token, so this
        reads and resets in one pass over the choices what ``absorb`` reads in several (same
        reads, same resets, same order: nothing changes before the reading succeeded)."""
        prompt = completion = content = None
        if call.ids:
            if self.prompt_ids is None:
                prompt = data.get("prompt_token_ids")
                if type(prompt) is not list:
                    prompt = None
            for choice in choices:
                if type(choice) is dict and choice.get("index", 0) == 0:
                    completion = choice.get("token_ids")
                    if type(completion) is not list:
                        completion = None
                    lp = choice.get("logprobs")
                    if type(lp) is dict:
                        entries = lp.get("content")
                        if entries:
                            content = ([float(entries[0]["logprob"])] if len(entries) == 1
                                       else [float(entry["logprob"]) for entry in entries])
                    break
        if prompt is not None:
            self.prompt_ids = prompt
        if completion is not None:
            if self.completion_ids is None:
                self.completion_ids = list(completion)
            else:
                self.completion_ids.extend(completion)
        if content:
            self.logprobs.extend(content)
        self.absorbed += 1
        _reset(data, choices, call)


def _reset(data: dict[str, Any], choices: list[Any], call: Asked) -> None:
    """Reset in a body what was asked for on the caller's behalf (ids, logprobs), so the SDK
    builds the models the caller would have had; one pass over the choices."""
    ids, logprobs = call.injected_ids, call.injected_logprobs
    if ids and data.get("prompt_token_ids") is not None:
        data["prompt_token_ids"] = None
    if ids or logprobs:
        for choice in choices:
            if type(choice) is dict:
                if ids and choice.get("token_ids") is not None:
                    choice["token_ids"] = None
                if logprobs and choice.get("logprobs") is not None:
                    choice["logprobs"] = None


def activate(take: Take) -> Token[Take | None]:
    """Let ``take`` read the bodies the SDK parses in this context, until ``deactivate``.

    Plain functions rather than a context manager: streams call them around every chunk."""
    return _active.set(take)


def deactivate(token: Token[Take | None]) -> None:
    _active.reset(token)


def _process_response_data(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    take = _active.get()
    if take is not None:
        data = kwargs.get("data")
        if type(data) is dict:
            try:
                take.absorb(data)
            except Exception:  # a malformed body: the models are read instead
                logger.debug("agl_bridge: could not read a response body", exc_info=True)
    return wrapped(*args, **kwargs)


def install() -> None:
    """Wrap the SDK's body parser (a pass-through while no ``Take`` is active). Idempotent."""
    owner = _owner()
    if owner is None:
        logger.debug("agl_bridge: this openai has no %s; ids are read from its models", _METHOD)
        return
    current = owner.__dict__.get(_NAME)
    if getattr(current, "_self_wrapper", None) is not _process_response_data:
        wrap_function_wrapper(owner, _NAME, _process_response_data)


def uninstall() -> None:
    """Take the wrapper off again if it is the outermost layer (as ``patch._unwrap`` does)."""
    owner = _owner()
    current = owner.__dict__.get(_NAME) if owner is not None else None
    if getattr(current, "_self_wrapper", None) is _process_response_data:
        setattr(owner, _NAME, current.__wrapped__)  # type: ignore[union-attr]


def _owner() -> type | None:
    try:
        from openai._base_client import BaseClient
    except ImportError:
        return None
    return BaseClient if callable(BaseClient.__dict__.get(_NAME)) else None
