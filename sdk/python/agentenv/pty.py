"""``sbx.pty``: interactive terminals (a login bash on a pseudo-terminal) through envd,
as E2B's ``Sandbox.pty``."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Dict, Optional

from . import exceptions as exc
from ._transport import connect_stream
from .commands import DEFAULT_COMMAND_TIMEOUT, CommandHandle, Commands, PtyHandler

_SERVICE = "process.Process/"


@dataclass
class PtySize:
    """A terminal's size in character cells."""

    rows: int
    cols: int


def _size(size: PtySize) -> Dict[str, int]:
    rows, cols = int(size.rows), int(size.cols)
    if rows < 1 or cols < 1:
        raise exc.InvalidArgumentException(f"PTY size {cols}x{rows}: give at least 1 column and 1 row")
    return {"rows": rows, "cols": cols}


class Pty:
    """Terminals in the sandbox (``sbx.pty``). Output comes as bytes, to
    ``on_data`` and through the handle's iteration (``(None, None, data)``)."""

    def __init__(self, commands: Commands):
        self._commands = commands
        self._envd = commands._envd

    def create(self, size: PtySize, user: Optional[str] = None, cwd: Optional[str] = None,
               envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
               request_timeout: Optional[float] = None, on_data: Optional[PtyHandler] = None) -> CommandHandle:
        """Starts ``/bin/bash -i -l`` on a terminal of ``size``; returns its handle
        at once (a thread reads the output). ``timeout`` (seconds, 0 = none)
        bounds the terminal's life, as E2B's."""
        env = dict(envs or {})
        for k, v in (("TERM", "xterm-256color"), ("LANG", "C.UTF-8"), ("LC_ALL", "C.UTF-8")):
            env.setdefault(k, v)
        proc: Dict[str, Any] = {"cmd": "/bin/bash", "args": ["-i", "-l"], "envs": env}
        if cwd:
            proc["cwd"] = cwd
        msg = {"process": proc, "pty": {"size": _size(size)}}
        stream = connect_stream(self._envd.transport, self._envd.base, self._commands._start_headers(user),
                                _SERVICE + "Start", msg, timeout=timeout,
                                read_timeout=self._commands._read_timeout(request_timeout), explain=self._envd.explain)
        return self._commands._handle(stream, None, None, background=True, on_pty=on_data)

    def connect(self, pid: int, timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
                request_timeout: Optional[float] = None, on_data: Optional[PtyHandler] = None) -> CommandHandle:
        """Attaches to a running terminal's output (from now on)."""
        stream = connect_stream(self._envd.transport, self._envd.base, dict(self._envd.headers),
                                _SERVICE + "Connect", {"process": {"pid": pid}}, timeout=timeout,
                                read_timeout=self._commands._read_timeout(request_timeout), explain=self._envd.explain)
        return self._commands._handle(stream, None, None, background=True, on_pty=on_data)

    def send_stdin(self, pid: int, data: bytes, request_timeout: Optional[float] = None) -> None:
        """Types ``data`` (bytes; a str is UTF-8 encoded) into the terminal."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._commands._unary("SendInput", {"process": {"pid": pid}, "input": {"pty": base64.b64encode(raw).decode()}},
                              request_timeout)

    def resize(self, pid: int, size: PtySize, request_timeout: Optional[float] = None) -> None:
        """Sets the terminal's size (the shell gets SIGWINCH)."""
        self._commands._unary("Update", {"process": {"pid": pid}, "pty": {"size": _size(size)}}, request_timeout)

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills the terminal's shell with SIGKILL; False if there was none with that pid."""
        return self._commands.kill(pid, request_timeout)
