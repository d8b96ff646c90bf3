"""Typed exceptions, named as in E2B's Python SDK (``e2b.exceptions``).

Every exception carries the server's message; those raised for an HTTP or
Connect-RPC answer also carry its status (``status_code``), the server's
machine-readable class (``error_code``), when there was one, and the
server's own words without the SDK's context (``reason``).

A failure that ended a sandbox or a command also says its ``cause``, one
of ``CAUSES`` (None when the server said nothing more precise): after a
broken stream or a 502 from the sandbox's proxy, the SDK asks the API what
became of the sandbox and raises what it learns: ``OutOfMemoryException``
or ``SandboxLostException`` (it died on its own), ``TimeoutException``
with cause "sandbox_timeout" (it reached its timeout), or
``SandboxNotFoundException`` with cause "killed".

The hierarchy is E2B's: every class is a ``SandboxException`` except
``AuthenticationException`` (a missing or wrong API key or access token).
A user's file or directory permission error is a plain ``SandboxException``
(``error_code`` "permission_denied", ``status_code`` 403), as E2B raises it.
"""

from __future__ import annotations

from typing import Optional


# What ended a sandbox or a command, as ``exception.cause`` gives it.
CAUSES = (
    "oom",              # the sandbox (or the command) ran out of memory
    "lost",             # the sandbox died on its own, for the reason in ``reason``
    "sandbox_timeout",  # the sandbox reached its timeout
    "killed",           # the sandbox was killed (Sandbox.kill, by anyone)
    "command_timeout",  # the command reached its own timeout; its output so far is kept
)


class _ServerError(Exception):
    def __init__(self, message: str = "", status_code: Optional[int] = None, error_code: Optional[str] = None,
                 reason: Optional[str] = None, cause: Optional[str] = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.error_code = error_code
        self.reason = reason or message
        self.cause = cause


class SandboxException(_ServerError):
    """Base of the errors this SDK raises (``AuthenticationException`` aside, as in E2B)."""


class TimeoutException(SandboxException):
    """A request, a command or the sandbox itself ran out of time.

    ``cause`` says which: "command_timeout" (the command's ``timeout``;
    ``stdout``/``stderr`` hold what it printed until then),
    "sandbox_timeout" (the sandbox's own timeout ended it), or None (a
    request that got no answer in time)."""

    stdout: Optional[str] = None
    stderr: Optional[str] = None


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


class SandboxLostException(SandboxNotFoundException):
    """The sandbox died on its own (agentenv's own class: E2B's sandboxes are
    VMs that do not): ``reason`` is the server's why, e.g. its init process
    exited. ``cause`` is "lost", or "oom" for ``OutOfMemoryException``."""


class OutOfMemoryException(SandboxLostException):
    """The sandbox died because its processes passed its memory limit
    (agentenv's own class). Create it with more memory, or use less."""


class AuthenticationException(_ServerError):
    """The API key (or the sandbox's access token) is missing or wrong (HTTP
    401). Not a ``SandboxException``, as in E2B."""


class RateLimitException(SandboxException):
    """The server is at a limit (HTTP 429); retry later."""


class TemplateException(SandboxException):
    """The template cannot be used (e.g. its envd is too old)."""


class ConflictException(SandboxException):
    """The request conflicts with the resource's state (HTTP 409), e.g. a snapshot in use."""
