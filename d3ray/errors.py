"""Errors that are the user's to fix: a config key or value, a path, a data file over its limits.

The command line prints a :class:`UserError` as one or two lines (what, where, how to fix it) and
exits with status 2; any other exception is a bug and keeps its traceback. ``--debug`` shows the
traceback of a user error too. Subclasses keep their standard base (``ValueError``,
``FileNotFoundError``) so that library callers can catch them as usual.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input; the message says what, where and how to fix it."""


class DataPathError(UserError, FileNotFoundError):
    """A configured data path matches no readable shard."""
