"""Typed exceptions, named as in E2B's Python SDK (``e2b.exceptions``).

Every exception carries the server's message; those raised for an HTTP or
Connect-RPC answer also carry its status (``status_code``), the server's
machine-readable class (``error_code``), when there was one, and the
server's own words without the SDK's context (``reason``).

The hierarchy is E2B's: every class is a ``SandboxException`` except
``AuthenticationException`` (a missing or wrong API key or access token).
A user's file or directory permission error is a plain ``SandboxException``
(``error_code`` "permission_denied", ``status_code`` 403), as E2B raises it.
"""

from __future__ import annotations

from typing import Optional


class _ServerError(Exception):
    def __init__(self, message: str = "", status_code: Optional[int] = None, error_code: Optional[str] = None,
                 reason: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_code = error_code
        self.reason = reason or message


class SandboxException(_ServerError):
    """Base of the errors this SDK raises (``AuthenticationException`` aside, as in E2B)."""


class TimeoutException(SandboxException):
    """A request, a command or the sandbox itself ran out of time."""


class InvalidArgumentException(SandboxException):
    """The server refused an argument (HTTP 400, Connect invalid_argument)."""


class NotEnoughSpaceException(SandboxException):
    """The sandbox's disk is full."""


class NotFoundException(SandboxException):
    """A sandbox, snapshot, template, file or process does not exist."""


class FileNotFoundException(NotFoundException):
    """A file or directory in the sandbox does not exist."""


class SandboxNotFoundException(NotFoundException):
    """The sandbox does not exist (killed, timed out, or never created)."""


class AuthenticationException(_ServerError):
    """The API key (or the sandbox's access token) is missing or wrong (HTTP
    401). Not a ``SandboxException``, as in E2B."""


class RateLimitException(SandboxException):
    """The server is at a limit (HTTP 429); retry later."""


class TemplateException(SandboxException):
    """The template cannot be used (e.g. its envd is too old)."""


class ConflictException(SandboxException):
    """The request conflicts with the resource's state (HTTP 409), e.g. a snapshot in use."""
