"""``sbx.commands``: run, list, kill and connect to processes through envd."""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import exceptions as exc
from ._transport import ServerStream, b64decode, basic_user, connect_stream, connect_unary
from .config import EnvdConnection
from .models import CommandExitException, CommandResult, ProcessInfo

OutputHandler = Callable[[str], Any]
PtyHandler = Callable[[bytes], Any]

_SERVICE = "process.Process/"
DEFAULT_COMMAND_TIMEOUT = 60.0


class CommandHandle:
    """A started command. ``wait()`` gives its result; ``kill()`` ends it;
    iterating yields ``(stdout, stderr, pty)`` chunks from the start, as they come.

    Background commands are read by a thread of their own, so callbacks see
    output as it comes and the process never blocks on a full pipe.
    """

    def __init__(self, pid: int, stream: ServerStream, events: Iterator[Dict[str, Any]], kill: Callable[[], bool],
                 on_stdout: Optional[OutputHandler] = None, on_stderr: Optional[OutputHandler] = None,
                 background: bool = False, on_pty: Optional[PtyHandler] = None,
                 max_output: Optional[int] = None):
        self._pid = pid
        # Characters of stdout and of stderr kept (each); the rest is
        # dropped and counted, so a huge output cannot fill the client.
        self._max_output = max_output
        self._kept = {"stdout": 0, "stderr": 0}
        self.stdout_truncated = False
        self.stderr_truncated = False
        self._stream, self._events, self._kill = stream, events, kill
        self._on_stdout, self._on_stderr, self._on_pty = on_stdout, on_stderr, on_pty
        # Output in arrival order: (stdout, stderr, pty), one of them set.
        self._chunks: List[Tuple[Optional[str], Optional[str], Optional[bytes]]] = []
        self._result: Optional[CommandResult] = None
        self._error: Optional[BaseException] = None
        self._cond = threading.Condition()
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if background:
            self._thread = threading.Thread(target=self._consume, name=f"agentenv-cmd-{pid}", daemon=True)
            self._thread.start()

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def stdout(self) -> str:
        with self._cond:
            return "".join(o for o, _, _ in self._chunks if o)

    @property
    def stderr(self) -> str:
        with self._cond:
            return "".join(e for _, e, _ in self._chunks if e)

    @property
    def exit_code(self) -> Optional[int]:
        return self._result.exit_code if self._result else None

    @property
    def error(self) -> Optional[str]:
        return self._result.error if self._result else None

    def _consume(self) -> None:
        try:
            for ev in self._events:
                event = ev.get("event") or {}
                if "data" in event:
                    self._data(event["data"])
                elif "end" in event:
                    end = event["end"]
                    self._result = CommandResult(stdout=self.stdout, stderr=self.stderr,
                                                 exit_code=int(end.get("exitCode", 0)), error=end.get("error"))
            if self._result is None and not self._stream.closed:
                raise exc.SandboxException("the command's stream ended without an exit code")
        except exc.TimeoutException as e:
            if e.error_code == "deadline_exceeded" and e.cause is None:
                # The command's own time limit: say so, with what it printed.
                e.cause, e.stdout, e.stderr = "command_timeout", self.stdout, self.stderr
            self._error = e
        except BaseException as e:  # handed to wait()
            self._error = e
        finally:
            with self._cond:
                self._done.set()
                self._cond.notify_all()

    def _data(self, data: Dict[str, str]) -> None:
        out = b64decode(data["stdout"]).decode("utf-8", "replace") if "stdout" in data else None
        err = b64decode(data["stderr"]).decode("utf-8", "replace") if "stderr" in data else None
        pty = b64decode(data["pty"]) if "pty" in data else None
        if self._max_output is not None:
            out, err = self._cap("stdout", out), self._cap("stderr", err)
        if out is None and err is None and pty is None:
            return
        with self._cond:
            self._chunks.append((out, err, pty))
            self._cond.notify_all()
        if pty is not None and self._on_pty is not None:
            self._on_pty(pty)
        if out is not None and self._on_stdout is not None:
            self._on_stdout(out)
        if err is not None and self._on_stderr is not None:
            self._on_stderr(err)

    def _cap(self, name: str, text: Optional[str]) -> Optional[str]:
        if text is None or self._max_output is None:
            return text
        room = self._max_output - self._kept[name]
        if len(text) > room:
            setattr(self, name + "_truncated", True)
            text = text[:max(room, 0)]
        self._kept[name] += len(text)
        return text or None

    def wait(self, on_pty: Optional[PtyHandler] = None, on_stdout: Optional[OutputHandler] = None,
             on_stderr: Optional[OutputHandler] = None) -> CommandResult:
        """Waits for the end; raises ``CommandExitException`` on a non-zero exit code.
        ``on_pty`` receives a terminal's output (bytes) from now on."""
        if on_pty is not None:
            self._on_pty = on_pty
        if on_stdout is not None:
            self._on_stdout = on_stdout
        if on_stderr is not None:
            self._on_stderr = on_stderr
        if self._thread is None and not self._done.is_set():
            self._consume()
        self._done.wait()
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise exc.SandboxException("disconnected from the command before it ended")
        r = self._result
        if r.exit_code != 0:
            raise CommandExitException(stderr=r.stderr, stdout=r.stdout, exit_code=r.exit_code, error=r.error)
        return r

    def kill(self) -> bool:
        """Sends SIGKILL; False if the process was already gone."""
        return self._kill()

    def disconnect(self) -> None:
        """Stops reading the output; the command keeps running."""
        self._stream.close()

    def __iter__(self) -> Iterator[Tuple[Optional[str], Optional[str], Optional[bytes]]]:
        """Yields (stdout, stderr, pty) chunks: those so far, then new ones until the end."""
        if self._thread is None and not self._done.is_set():
            self._thread = threading.Thread(target=self._consume, name=f"agentenv-cmd-{self._pid}", daemon=True)
            self._thread.start()
        i = 0
        while True:
            with self._cond:
                while i >= len(self._chunks) and not self._done.is_set():
                    self._cond.wait()
                if i >= len(self._chunks):
                    return
                chunk = self._chunks[i]
            i += 1
            yield chunk


class Commands:
    """Runs commands in the sandbox (``sbx.commands``)."""

    def __init__(self, envd: EnvdConnection):
        self._envd = envd

    def _unary(self, method: str, msg: Dict[str, Any], request_timeout: Optional[float],
               user: Optional[str] = None) -> Dict[str, Any]:
        h = dict(self._envd.headers, **basic_user(user))
        return connect_unary(self._envd.transport, self._envd.base, h, _SERVICE + method, msg,
                             self._envd.config.timeout(request_timeout), self._envd.explain)

    def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        """The processes envd runs."""
        out = self._unary("List", {}, request_timeout)
        res = []
        for p in out.get("processes", []):
            c = p.get("config") or {}
            res.append(ProcessInfo(pid=int(p.get("pid", 0)), tag=p.get("tag"), cmd=c.get("cmd", ""),
                                   args=c.get("args") or [], envs=c.get("envs") or {}, cwd=c.get("cwd")))
        return res

    def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        """Kills a process with SIGKILL; False if there was none with that pid."""
        try:
            self._unary("SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}, request_timeout)
        except exc.NotFoundException:
            return False
        return True

    def send_stdin(self, pid: int, data: str, request_timeout: Optional[float] = None) -> None:
        """Writes to a process's stdin (started with ``stdin=True``)."""
        import base64
        self._unary("SendInput", {"process": {"pid": pid}, "input": {"stdin": base64.b64encode(data.encode()).decode()}},
                    request_timeout)

    def run(self, cmd: str, background: bool = False, envs: Optional[Dict[str, str]] = None,
            user: Optional[str] = None, cwd: Optional[str] = None, on_stdout: Optional[OutputHandler] = None,
            on_stderr: Optional[OutputHandler] = None, stdin: Optional[bool] = None,
            timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT, request_timeout: Optional[float] = None,
            max_output: Optional[int] = None) -> Any:
        """Runs ``cmd`` with ``/bin/bash -l -c``.

        Foreground: waits and returns a ``CommandResult``; raises
        ``CommandExitException`` on a non-zero exit code. ``background=True``:
        returns a ``CommandHandle`` at once. ``timeout`` (seconds, 0 = none)
        bounds the command's life: envd kills it then and the call raises
        ``TimeoutException`` (cause "command_timeout", with the output so far
        in its ``stdout``/``stderr``). When the sandbox itself ends under the
        command, the exception says how (``OutOfMemoryException``,
        ``SandboxLostException``, ``TimeoutException`` with cause
        "sandbox_timeout", ``SandboxNotFoundException``).
        ``max_output`` (agentenv's own): keep at most this many characters
        of stdout and of stderr each; the handle's ``stdout_truncated`` /
        ``stderr_truncated`` say whether some was dropped.
        """
        proc: Dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", cmd], "envs": envs or {}}
        if cwd:
            proc["cwd"] = cwd
        msg = {"process": proc, "stdin": bool(stdin)}
        h = self._start_headers(user)
        stream = connect_stream(self._envd.transport, self._envd.base, h, _SERVICE + "Start", msg,
                                timeout=timeout, read_timeout=self._read_timeout(request_timeout),
                                explain=self._envd.explain)
        handle = self._handle(stream, on_stdout, on_stderr, background, max_output=max_output)
        return handle if background else handle.wait()

    def connect(self, pid: int, timeout: Optional[float] = DEFAULT_COMMAND_TIMEOUT,
                request_timeout: Optional[float] = None, on_stdout: Optional[OutputHandler] = None,
                on_stderr: Optional[OutputHandler] = None) -> CommandHandle:
        """Attaches to a running process's output."""
        stream = connect_stream(self._envd.transport, self._envd.base, dict(self._envd.headers),
                                _SERVICE + "Connect", {"process": {"pid": pid}}, timeout=timeout,
                                read_timeout=self._read_timeout(request_timeout), explain=self._envd.explain)
        return self._handle(stream, on_stdout, on_stderr, background=True)

    def _start_headers(self, user: Optional[str]) -> Dict[str, str]:
        return dict(self._envd.headers, **basic_user(user))

    def _read_timeout(self, request_timeout: Optional[float]) -> float:
        # envd sends a keepalive every 20 s (Keepalive-Ping-Interval), so a
        # silent minute means the connection is gone.
        return max(self._envd.config.timeout(request_timeout), 60.0)

    def _handle(self, stream: ServerStream, on_stdout: Optional[OutputHandler], on_stderr: Optional[OutputHandler],
                background: bool, on_pty: Optional[PtyHandler] = None,
                max_output: Optional[int] = None) -> CommandHandle:
        events = iter(stream)
        pid = 0
        for ev in events:
            start = (ev.get("event") or {}).get("start")
            if start is not None:
                pid = int(start.get("pid", 0))
                break
        else:
            raise exc.SandboxException("the process stream ended before the process started")
        return CommandHandle(pid, stream, events, lambda: self.kill(pid), on_stdout, on_stderr, background, on_pty,
                             max_output)
