"""A pytest plugin (``-p tests.gpu.collected``) that writes, to the file named by
``AGL_COLLECTED``, which tests a run selected and which it deselected, each with whether it
carries the ``gpu`` marker: one collection shows both what the default run keeps and what it
leaves for ``make test-gpu``."""

from __future__ import annotations

import json
import os

_DESELECTED: list = []


def _row(item) -> dict:
    return {"id": item.nodeid, "gpu": item.get_closest_marker("gpu") is not None}


def pytest_deselected(items) -> None:
    _DESELECTED.extend(_row(i) for i in items)


def pytest_collection_finish(session) -> None:
    with open(os.environ["AGL_COLLECTED"], "w") as f:
        json.dump({"selected": [_row(i) for i in session.items], "deselected": _DESELECTED}, f)
