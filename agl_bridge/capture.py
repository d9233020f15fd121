"""What content capture keeps: chosen by ``AGL_BRIDGE_CAPTURE``, read at each call (cheap).

* ``none``: structure only: span names, timings, models, usage, scope, rewards; no token ids,
  no text. For observability without any payload.
* ``token_ids`` (default): adds prompt and completion token ids and logprobs, and tool-call
  names; never message text. Ids are what training needs, and ids alone are not readable
  without the model's tokenizer, so traces can leave the process with less risk than text.
* ``messages``: adds message text, tool definitions and tool-call arguments
  (``gen_ai.input.messages`` / ``gen_ai.output.messages``). Needed for retokenization and for
  reading traces by eye; treat the files as sensitive.
"""

from __future__ import annotations

import enum
import os

CAPTURE_ENV = "AGL_BRIDGE_CAPTURE"


class CaptureLevel(enum.IntEnum):
    NONE = 0
    TOKEN_IDS = 1
    MESSAGES = 2


DEFAULT_LEVEL = CaptureLevel.TOKEN_IDS
_BY_NAME = {level.name.lower(): level for level in CaptureLevel}


def capture_level() -> CaptureLevel:
    raw = os.environ.get(CAPTURE_ENV, "").strip().lower()
    if not raw:
        return DEFAULT_LEVEL
    try:
        return _BY_NAME[raw]
    except KeyError:
        raise ValueError(
            f"{CAPTURE_ENV}={raw!r}: expected one of {', '.join(_BY_NAME)}") from None


def capture_messages() -> bool:
    return capture_level() >= CaptureLevel.MESSAGES
