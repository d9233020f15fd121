"""Why an LLM call was not converted (skips) and what is worth knowing (notes): one spelling.

The convert summary prints these, tests assert on them and users grep for them, so each is
spelled once, here. ``ConversionStats.skipped`` counts LLM calls left out; ``notes`` counts
things that were handled (kept, repaired, ignored) but that a user should see.
"""

from __future__ import annotations

# -- skips: the LLM call gives no transition ----------------------------------------------------
NO_TOKEN_IDS = "no token ids on the LLM span"
EMPTY_COMPLETION = "empty completion"
NO_REWARD = "episode has no reward"
REWARD_OVERFLOW = "reward overflows a float (a sum of finite rewards beyond 1.8e308)"

# -- notes ---------------------------------------------------------------------------------------
DUPLICATE_SPAN = "duplicate span id (later copy ignored)"
BAD_LOGPROBS = "logprobs length differs from completion (logprobs dropped)"
CLOCK_SKEW = "span ends before it starts (clock skew; kept)"
NOT_EXTENDING = "call does not extend its turn's context (kept separate)"
NO_TASK = "transition without task id (its own group: no GRPO signal)"
TURN_FROM_ROUND = "turn from the coordination round (no turn attribute)"
TURN_INFERRED = "turn inferred (no turn attribute)"
NON_FINITE_REWARD = "non-finite reward (rejected)"
HOLEY_LIST = "null inside an id or logprob list (the list is ignored)"
RETOKENIZED = "ids rebuilt from messages (retokenized)"
OTLP_LINE_BAD = "OTLP/JSON line that could not be read (quarantined)"
AGENT_FROM_ANCESTOR = "agent of an LLM call taken from an enclosing span (another instrumentor)"

# reasons a reward span cannot be matched (``EpisodeRewards.add``), noted with IGNORED_SUFFIX
AGENT_REWARD_WITHOUT_AGENT = "agent-scoped reward without an agent"
TURN_REWARD_WITHOUT_TURN = "turn-scoped reward without agent and turn"
IGNORED_SUFFIX = " (ignored)"


def unknown_reward_scope(scope: object) -> str:
    return f"unknown reward scope {scope!r}"


UNREADABLE_FILE_PREFIX = "unreadable file skipped: "


def unreadable_file(name: str, why: str) -> str:
    """A span file that could not be read at all (truncated, not Parquet): skipped."""
    return f"{UNREADABLE_FILE_PREFIX}{name} ({why})"


def retokenize_agreement(part: str, agrees: bool) -> str:
    """Rebuilt ids of ``part`` (prompt, completion) against the ids the span recorded."""
    return f"retokenized {part} {'agrees with' if agrees else 'differs from'} the recorded ids"


def retokenize_failed(error: str) -> str:
    return f"messages could not be retokenized ({error})"


def foreign_read(convention: str) -> str:
    """An LLM call whose messages another instrumentor's convention held (``foreign.py``)."""
    return f"messages read from {convention}"


def foreign_unreadable(convention: str, key: str, why: str) -> str:
    """Messages in another convention that could not be read: the call gets no ids."""
    return f"{convention} messages unreadable, call skipped ({key}: {why})"


def foreign_left_out(key: str, why: str) -> str:
    """A part of a call's messages that could not be read and was left out; the call converts."""
    return f"{key} unreadable, left out of the call's messages ({why})"
