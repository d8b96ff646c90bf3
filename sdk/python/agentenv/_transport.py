"""HTTP/1.1 with pooled connections, the REST API and Connect-RPC (JSON).

Standard library only. One ``Transport`` is shared by every sandbox of a
configuration; it is thread-safe: a connection is used by one request at a
time and goes back to the pool once its response has been read to the end.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import struct
import threading
import urllib.parse
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, Union

from . import exceptions as exc

ENVD_PORT = 49983
# error_code of a stream from envd that ended in the middle (no end message).
STREAM_BROKEN = "stream_broken"
_CHUNK = 1 << 16

# MAX_MESSAGE_BYTES bounds one Connect-RPC message from envd (a stream
# envelope or a unary answer). A length is what the peer claims: read as
# sent, a broken or hostile envd could make the SDK allocate gigabytes.
MAX_MESSAGE_BYTES = 64 << 20

Body = Union[None, bytes, BinaryIO, Iterator[bytes]]


class _Pool:
    """Idle keep-alive connections to one host."""

    def __init__(self, scheme: str, host: str, port: int, size: int):
        self.scheme, self.host, self.port, self.size = scheme, host, port, size
        self._idle: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def get(self, timeout: Optional[float], fresh: bool = False) -> http.client.HTTPConnection:
        conn = None
        if not fresh:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
        if conn is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            conn = cls(self.host, self.port, timeout=timeout)
        else:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
        return conn

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.size:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()


class Response:
    """A response whose connection returns to the pool once fully read."""

    def __init__(self, resp: http.client.HTTPResponse, conn: http.client.HTTPConnection, pool: _Pool):
        self.status = resp.status
        self.headers = resp.headers
        self._resp, self._conn, self._pool = resp, conn, pool

    def read(self, limit: Optional[int] = None, what: str = "response") -> bytes:
        """Reads the whole body and releases the connection; more than
        ``limit`` bytes (if given) raise SandboxException."""
        try:
            if limit is None:
                return self._resp.read()
            buf = bytearray()
            while True:
                chunk = self._resp.read(_CHUNK)
                if not chunk:
                    return bytes(buf)
                buf += chunk
                if len(buf) > limit:
                    raise exc.SandboxException(
                        f"{what}: the answer is larger than {limit} bytes (max_message_bytes); it was dropped")
        finally:
            self.close()

    def readexactly(self, n: int) -> bytes:
        # In pieces: http.client allocates what one read asks for, before
        # anything arrives.
        buf = bytearray()
        while len(buf) < n:
            chunk = self._resp.read(min(n - len(buf), _CHUNK))
            if not chunk:
                raise exc.SandboxException("the server closed the stream in the middle of a message")
            buf += chunk
        return bytes(buf)

    def iter_chunks(self, size: int = _CHUNK) -> Iterator[bytes]:
        try:
            while True:
                chunk = self._resp.read(size)
                if not chunk:
                    return
                yield chunk
        finally:
            self.close()

    def close(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._resp.isclosed() and not self._resp.will_close:
            self._pool.put(conn)
        else:
            # Not read to the end (or the server will close it): drop it.
            conn.close()


class Transport:
    """Sends requests to one API server and its sandbox proxy."""

    def __init__(self, pool_size: int = 128, max_message_bytes: int = MAX_MESSAGE_BYTES):
        self._pools: Dict[Tuple[str, str, int], _Pool] = {}
        self._lock = threading.Lock()
        self._pool_size = pool_size
        # The largest Connect-RPC message taken from envd (see MAX_MESSAGE_BYTES).
        self.max_message_bytes = max_message_bytes

    def _pool(self, url: urllib.parse.SplitResult) -> _Pool:
        scheme = url.scheme or "http"
        port = url.port or (443 if scheme == "https" else 80)
        key = (scheme, url.hostname or "127.0.0.1", port)
        with self._lock:
            p = self._pools.get(key)
            if p is None:
                p = self._pools[key] = _Pool(scheme, key[1], port, self._pool_size)
            return p

    def request(self, method: str, url: str, headers: Dict[str, str], body: Body = None,
                timeout: Optional[float] = None) -> Response:
        """Sends one request; retries once on a stale pooled connection."""
        parts = urllib.parse.urlsplit(url)
        target = parts.path + ("?" + parts.query if parts.query else "")
        pool = self._pool(parts)
        attempts = 2 if isinstance(body, (bytes, type(None))) else 1
        for attempt in range(attempts):
            # A retry takes a new connection: after one idle connection was
            # found closed, the others of the pool may be closed too.
            conn = pool.get(timeout, fresh=attempt > 0)
            reused = conn.sock is not None
            try:
                _send(conn, method, target, headers, body)
                resp = conn.getresponse()
            except socket.timeout as e:
                conn.close()
                raise exc.TimeoutException(f"request {method} {url} timed out after {timeout} s") from e
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as e:
                conn.close()
                if reused and attempt + 1 < attempts:
                    continue  # the server closed an idle connection
                raise exc.SandboxException(f"cannot reach {parts.scheme}://{parts.netloc}: {e}") from e
            except OSError as e:
                conn.close()
                raise exc.SandboxException(
                    f"cannot reach {parts.scheme}://{parts.netloc} (is `agentenv serve` running? "
                    f"set E2B_API_URL/E2B_SANDBOX_URL or AGENTENV_SERVER): {e}") from e
            return Response(resp, conn, pool)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            pools, self._pools = list(self._pools.values()), {}
        for p in pools:
            p.close()


def _send(conn: http.client.HTTPConnection, method: str, target: str, headers: Dict[str, str], body: Body) -> None:
    if body is None or isinstance(body, (bytes, bytearray)):
        conn.request(method, target, body=body, headers=headers)
        return
    # A stream: chunked transfer encoding, so large files never sit in memory.
    conn.putrequest(method, target, skip_accept_encoding=True)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    chunks = body if not hasattr(body, "read") else iter(lambda: body.read(_CHUNK), b"")  # type: ignore[union-attr]
    for chunk in chunks:
        if isinstance(chunk, str):
            chunk = chunk.encode()
        if chunk:
            conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")


# --- errors -----------------------------------------------------------------

_BY_STATUS = {
    400: exc.InvalidArgumentException,
    401: exc.AuthenticationException,
    # 403 (a user's file permission, a sandbox's traffic token) stays a
    # plain SandboxException, as in E2B: only a bad key is authentication.
    404: exc.NotFoundException,
    409: exc.ConflictException,
    413: exc.InvalidArgumentException,
    429: exc.RateLimitException,
    502: exc.TimeoutException,
    504: exc.TimeoutException,
    507: exc.NotEnoughSpaceException,
}

_BY_CONNECT_CODE = {
    "invalid_argument": exc.InvalidArgumentException,
    "failed_precondition": exc.InvalidArgumentException,
    "out_of_range": exc.InvalidArgumentException,
    "unauthenticated": exc.AuthenticationException,
    "not_found": exc.NotFoundException,
    "already_exists": exc.ConflictException,
    "deadline_exceeded": exc.TimeoutException,
    "canceled": exc.TimeoutException,
    "unavailable": exc.TimeoutException,
    "resource_exhausted": exc.NotEnoughSpaceException,
}


def error_from_http(status: int, raw: bytes, what: str) -> Exception:
    """Turns an error answer (REST API, envd /files, or a unary RPC) into an exception."""
    message, code, rpc_code, end_cause = raw.decode("utf-8", "replace").strip(), None, None, None
    try:
        doc = json.loads(raw)
        if isinstance(doc, dict):
            message = str(doc.get("message") or message)
            end_cause = doc.get("end_cause")
            # REST answers: {"code": <status>, "error_code": ...};
            # Connect-RPC answers: {"code": "<connect code>"}.
            if isinstance(doc.get("code"), str):
                rpc_code = doc["code"]
            code = doc.get("error_code") or rpc_code
    except ValueError:
        pass
    if rpc_code in _BY_CONNECT_CODE:
        cls = _BY_CONNECT_CODE[rpc_code]
    else:
        cls = _BY_STATUS.get(status, exc.SandboxException)
    if status == 502 and not message:
        message = "the sandbox is not running (it was killed or timed out)"
    e = cls(f"{what}: {message} (HTTP {status})", status_code=status, error_code=code, reason=message)
    # agentenv's 404 for a sandbox that ended says why (gone_error reads it).
    e.end_cause = end_cause if isinstance(end_cause, str) else None
    return e


def error_from_connect(err: Dict[str, Any], what: str) -> Exception:
    code = str(err.get("code", "unknown"))
    cls = _BY_CONNECT_CODE.get(code, exc.SandboxException)
    reason = str(err.get("message") or code)
    return cls(f"{what}: {reason} ({code})", error_code=code, reason=reason)


# How a sandbox ended, from the 404 its GET /sandboxes/{id} answers: the
# body's end_cause (agentenv's extension) when there is one; else, for a
# server from before it, the server's words in the message (internal/sandbox:
# the registry's tombstones of lost sandboxes and its memory of killed and
# timed-out ones); tests pin both against a real server.
_LOST = " was lost: "
_TIMED_OUT = "it timed out at "
_KILLED = "it was killed"
_OOM_WORDS = ("out of memory", "oom-kill", "oom kill", "out of its memory")


def gone_error(nf: exc.SandboxException, sandbox_id: str, what: str) -> exc.SandboxException:
    """The exception that says how a sandbox ended, from the not-found
    answer of GET /sandboxes/{id}."""
    why = nf.reason
    if why.endswith(": not found"):
        why = why[:-len(": not found")]
    kw: Dict[str, Any] = {"status_code": nf.status_code, "error_code": nf.error_code, "reason": why}
    by_cause = {"oom": (exc.OutOfMemoryException, "oom"), "lost": (exc.SandboxLostException, "lost"),
                "timeout": (exc.TimeoutException, "sandbox_timeout"),
                "killed": (exc.SandboxNotFoundException, "killed")}
    if getattr(nf, "end_cause", None) in by_cause:
        cls, cause = by_cause[nf.end_cause]
        return cls(f"{what}: {why}", cause=cause, **kw)
    if _LOST in why:
        lost = why.split(_LOST, 1)[1]
        if any(w in lost.lower() for w in _OOM_WORDS):
            return exc.OutOfMemoryException(f"{what}: {why}", cause="oom", **kw)
        return exc.SandboxLostException(f"{what}: {why}", cause="lost", **kw)
    if _TIMED_OUT in why:
        return exc.TimeoutException(f"{what}: {why}", cause="sandbox_timeout", **kw)
    if _KILLED in why:
        return exc.SandboxNotFoundException(f"{what}: {why}", cause="killed", **kw)
    return exc.SandboxNotFoundException(f"{what}: {why}", **kw)


def maybe_gone(err: BaseException) -> bool:
    """Whether an error of a call to envd may mean its sandbox is gone: a
    stream cut in the middle, or the proxy's 502 (no sandbox to route to)."""
    if not isinstance(err, exc.SandboxException) or err.cause is not None:
        return False
    return err.error_code == STREAM_BROKEN or err.status_code == 502


def read_json(resp: Response, what: str) -> Any:
    raw = resp.read()
    if resp.status >= 300:
        raise error_from_http(resp.status, raw, what)
    if not raw:
        return None
    return json.loads(raw)


# --- Connect-RPC over HTTP/1.1, JSON codec ----------------------------------

# Explain turns the error of a call to envd into a more precise one when it
# can (see EnvdConnection.explain): the sandbox may be gone.
Explain = Callable[[BaseException], BaseException]


def _explained(explain: Optional[Explain], err: BaseException) -> BaseException:
    return explain(err) if explain is not None else err


def connect_unary(t: Transport, base: str, headers: Dict[str, str], method: str, msg: Dict[str, Any],
                  timeout: Optional[float], explain: Optional[Explain] = None) -> Dict[str, Any]:
    h = dict(headers)
    h["Content-Type"] = "application/json"
    h["Connect-Protocol-Version"] = "1"
    if timeout:
        h["Connect-Timeout-Ms"] = str(int(timeout * 1000))
    resp = t.request("POST", base + "/" + method, h, json.dumps(msg).encode(), timeout=timeout or None)
    raw = resp.read(t.max_message_bytes, method)
    if resp.status >= 300:
        raise _explained(explain, error_from_http(resp.status, raw, method))
    return (json.loads(raw) if raw else None) or {}


class ServerStream:
    """Messages of a server-streaming call (5-byte envelopes, JSON payloads)."""

    def __init__(self, resp: Response, method: str, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 explain: Optional[Explain] = None):
        self._resp, self._method = resp, method
        self._max = max_message_bytes
        self._explain = explain
        self.closed = False

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        try:
            while True:
                head = self._resp.readexactly(5)
                flags, n = struct.unpack(">BI", head)
                if n > self._max:
                    raise exc.SandboxException(
                        f"{self._method}: the sandbox sent a message of {n} bytes, more than the limit of "
                        f"{self._max} (Transport max_message_bytes); the stream was closed")
                payload = json.loads(self._resp.readexactly(n)) if n else {}
                if flags & 0x02:
                    # End of stream: an error, or none when the call succeeded.
                    if payload.get("error"):
                        raise error_from_connect(payload["error"], self._method)
                    return
                yield payload
        except socket.timeout as e:
            raise exc.TimeoutException(f"{self._method}: no data from the sandbox in time") from e
        except (OSError, http.client.HTTPException) as e:
            if self.closed:
                return
            # The sandbox may have died under the call (its proxy cuts the
            # stream): "stream broken" alone says nothing, so ask.
            err = exc.SandboxException(f"{self._method}: stream broken: {e}", error_code=STREAM_BROKEN)
            err.__cause__ = e
            raise _explained(self._explain, err)
        finally:
            self.close()

    def close(self) -> None:
        self.closed = True
        self._resp.close()


def connect_stream(t: Transport, base: str, headers: Dict[str, str], method: str, msg: Dict[str, Any],
                   timeout: Optional[float], read_timeout: Optional[float],
                   explain: Optional[Explain] = None) -> ServerStream:
    h = dict(headers)
    h["Content-Type"] = "application/connect+json"
    h["Connect-Protocol-Version"] = "1"
    h["Keepalive-Ping-Interval"] = "20"  # envd sends a keepalive this often (s)
    if timeout:
        h["Connect-Timeout-Ms"] = str(int(timeout * 1000))
    data = json.dumps(msg).encode()
    resp = t.request("POST", base + "/" + method, h, struct.pack(">BI", 0, len(data)) + data, timeout=read_timeout)
    if resp.status != 200:
        raise _explained(explain, error_from_http(resp.status, resp.read(), method))
    return ServerStream(resp, method, t.max_message_bytes, explain)


def basic_user(user: Optional[str]) -> Dict[str, str]:
    """envd's way to name the user of a call (as E2B's SDK sends it)."""
    if not user:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:".encode()).decode()}


def b64decode(s: Optional[str]) -> bytes:
    return base64.b64decode(s) if s else b""


def query(params: Dict[str, Optional[str]]) -> str:
    return urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})


Callback = Callable[[str], Any]
