"""Which servers are vLLM: learned once per base URL from ``GET /version``.

vLLM answers ``/version`` with ``{"version": ...}``; only then do we ask a server for token ids
(``return_token_ids``), because any other server must get exactly the request the caller made.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request


class ServerProbe:
    """Remembers, per base URL, whether the server is vLLM. One ``GET /version`` per URL."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self._timeout = timeout_s
        self._kinds: dict[str, str] = {}
        self._lock = threading.Lock()
        self._url_locks: dict[str, threading.Lock] = {}

    @staticmethod
    def version_url(base_url: str) -> str:
        root = base_url.rstrip("/")
        if root.endswith("/v1"):
            root = root[: -len("/v1")]
        return root + "/version"

    def cached(self, base_url: str) -> str | None:
        return self._kinds.get(base_url)

    def kind(self, base_url: str) -> str:
        """``"vllm"`` or ``"other"``; network errors count as other (and are remembered).

        Concurrent first calls for one URL wait for a single probe instead of each sending one.
        """
        found = self._kinds.get(base_url)
        if found is not None:
            return found
        with self._lock:
            url_lock = self._url_locks.setdefault(base_url, threading.Lock())
        with url_lock:
            found = self._kinds.get(base_url)
            if found is not None:
                return found
            kind = "other"
            try:
                with urllib.request.urlopen(self.version_url(base_url),
                                            timeout=self._timeout) as r:
                    body = json.loads(r.read(4096) or b"{}")
                    if isinstance(body, dict) and "version" in body:
                        kind = "vllm"
            except (urllib.error.URLError, OSError, ValueError):
                pass
            with self._lock:
                self._kinds.setdefault(base_url, kind)
            return self._kinds[base_url]
