"""The one error publishing raises, in a module of its own so that validation, the registry and
the publisher can all raise it without importing each other."""

from __future__ import annotations


class PublishError(RuntimeError):
    """The adapter was refused or not served; the message names the file or server and why.

    Every refusal of a bad adapter, a damaged registry or a failing server is this error, never
    an AttributeError/KeyError/TypeError from deep inside: callers (the CLI, the training loop)
    catch one type and show its message."""


class NameTaken(PublishError):
    """A server already serves the name from another adapter (another registry, another run):
    nothing of this version may be recorded, or this registry's collector would unload the
    other one's adapter."""
