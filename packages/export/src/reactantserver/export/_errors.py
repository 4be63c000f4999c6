"""Errors raised by the exporter; the CLI turns them into one line on stderr and exit 2."""

from __future__ import annotations

__all__ = ["ExportError", "UnservableError"]


class ExportError(ValueError):
    """An export cannot proceed: a bad tensor spec, parameter tree, argument or bundle path."""


class UnservableError(ExportError):
    """The lowered module would not load on the server (the arity/signature gate).

    Raised before anything is written; the message starts with ``UNSERVABLE:``.
    """
