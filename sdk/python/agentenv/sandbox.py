"""``Sandbox``: create, connect to, list, pause, snapshot, fork and kill sandboxes.

The names and semantics are those of E2B's Python SDK (``e2b.Sandbox``);
``fork`` and the snapshot metadata are agentenv's own.
"""

from __future__ import annotations

import base64
import datetime as _dt
import functools
import hashlib
import inspect
import json
import urllib.parse
import warnings
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Tuple, Type, TypeVar, Union

from . import exceptions as exc
from ._transport import error_from_http
from .commands import Commands
from .config import ConnectionConfig, EnvdConnection
from .filesystem import Filesystem
from .pty import Pty
from .models import SandboxInfo, SandboxLifecycle, SandboxMetrics, SandboxQuery, SnapshotInfo

DEFAULT_TEMPLATE = "base"
DEFAULT_SANDBOX_TIMEOUT = 300

T = TypeVar("T")
S = TypeVar("S", bound="Sandbox")


class _either:
    """A method callable on an instance, or on the class with a sandbox ID first
    (E2B's ``Sandbox.kill(sandbox_id)`` beside ``sbx.kill()``)."""

    def __init__(self, inst: Callable[..., Any], cls_fn: Callable[..., Any]):
        self._inst, self._cls = inst, cls_fn
        functools.update_wrapper(self, inst)  # type: ignore[arg-type]

    def __get__(self, obj: Any, owner: Any) -> Any:
        if obj is None:
            return functools.partial(self._cls, owner)
        return self._inst.__get__(obj, owner)


def _fork_timeout_warning(positional: int) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Wraps a fork whose first argument (at ``positional`` in the call) is
    the children's timeout, as in E2B: ``fork(8)`` asks for one child that
    lives 8 s. A positional timeout under 10 s warns that ``count=`` was
    probably meant."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def acall(*args: Any, **kwargs: Any) -> Any:
                if len(args) > positional:
                    warn_fork_timeout(args[positional])
                return await fn(*args, **kwargs)
            return acall  # type: ignore[return-value]

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> T:
            if len(args) > positional:
                warn_fork_timeout(args[positional])
            return fn(*args, **kwargs)
        return call
    return wrap


def warn_fork_timeout(timeout: Any, stacklevel: int = 3) -> None:
    """The warning of a positional ``fork`` timeout under 10 s."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout < 10:
        warnings.warn(f"fork({timeout}) gives the children a timeout of {timeout} s (the first argument is "
                      f"E2B's timeout); for {timeout} children write fork(count={timeout}), or "
                      f"fork(timeout={timeout}) to keep this timeout", UserWarning, stacklevel=stacklevel)


class Paginator(Generic[T]):
    """E2B's paginator: ``has_next``, ``next_token``, ``next_items()`` (one
    page per call, chained by the server's ``X-Next-Token``). Iterating it
    walks the remaining pages.
    """

    def __init__(self, fetch: Callable[[Optional[str]], Tuple[List[T], Optional[str]]],
                 limit: Optional[int] = None, next_token: Optional[str] = None):
        self._fetch = fetch
        self.limit = limit
        self._has_next = True
        self._next_token = next_token

    @property
    def has_next(self) -> bool:
        """Whether another page may follow (True before the first page)."""
        return self._has_next

    @property
    def next_token(self) -> Optional[str]:
        """The token of the next page (None before the first and after the last)."""
        return self._next_token

    def next_items(self) -> List[T]:
        """The next page; raises when ``has_next`` is False."""
        if not self._has_next:
            raise exc.SandboxException("no more items to fetch: has_next is False")
        items, token = self._fetch(self._next_token)
        self._next_token, self._has_next = token, bool(token)
        return items

    def __iter__(self) -> Iterator[T]:
        while self._has_next:
            yield from self.next_items()


SandboxPaginator = Paginator
SnapshotPaginator = Paginator


_CONNECTION_OPTS = ("api_key", "api_url", "sandbox_url", "request_timeout", "domain", "debug")


def _config(opts: Dict[str, Any], what: str = "this call") -> ConnectionConfig:
    """The connection settings among ``opts``; any other keyword is a
    ``TypeError``, as Python's own calls raise, so a misspelt or unsupported
    option is never silently dropped."""
    unknown = sorted(set(opts) - set(_CONNECTION_OPTS))
    if unknown:
        raise TypeError(f"{what} got an unexpected keyword argument {unknown[0]!r} "
                        f"(connection options are {', '.join(_CONNECTION_OPTS)})")
    return ConnectionConfig(**{k: opts.get(k) for k in _CONNECTION_OPTS})


_NETWORK_OPTS = {"allow_out": "allowOut", "deny_out": "denyOut", "allow_public_traffic": "allowPublicTraffic"}


def _network_body(network: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """E2B's ``network`` create option (``allow_out``, ``deny_out``: IPv4
    addresses or CIDRs; ``allow_public_traffic``) as the create body's."""
    if network is None:
        return {}
    if not isinstance(network, dict):
        raise TypeError(f"network must be a dict with {', '.join(_NETWORK_OPTS)}, not {type(network).__name__}")
    unknown = sorted(set(network) - set(_NETWORK_OPTS))
    if unknown:
        raise TypeError(f"network got an unexpected key {unknown[0]!r} (it takes {', '.join(_NETWORK_OPTS)})")
    out: Dict[str, Any] = {}
    for k, wire in _NETWORK_OPTS.items():
        v = network.get(k)
        if v is None:
            continue
        if k == "allow_public_traffic":
            out[wire] = bool(v)
        elif isinstance(v, str) or not all(isinstance(a, str) for a in v):
            raise TypeError(f"network {k} must be a list of IPv4 addresses or CIDRs (str)")
        else:
            out[wire] = list(v)
    return {"network": out} if out else {}


def _size_body(memory_mb: Optional[int], cpu_count: Optional[int]) -> Dict[str, Any]:
    """agentenv's memory_mb and cpu_count create options as the body's
    memoryMB and cpuCount (None: the template's, else the server's)."""
    body: Dict[str, Any] = {}
    for name, wire, v in (("memory_mb", "memoryMB", memory_mb), ("cpu_count", "cpuCount", cpu_count)):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
        if v < 1:
            raise exc.InvalidArgumentException(f"{name} {v}: give a positive number, or leave it out for the template's")
        body[wire] = v
    return body


def _kill(config: ConnectionConfig, sandbox_id: str, request_timeout: Optional[float]) -> bool:
    try:
        config.api("DELETE", "/sandboxes/" + _q(sandbox_id), request_timeout=request_timeout,
                   what=f"kill sandbox {sandbox_id}")
    except exc.NotFoundException:
        return False
    return True


def _connect(config: ConnectionConfig, sandbox_id: str, timeout: Optional[int]) -> Dict[str, Any]:
    body = {"timeout": int(timeout)} if timeout else {}
    try:
        return config.api("POST", f"/sandboxes/{_q(sandbox_id)}/connect", body,  # type: ignore[return-value]
                          what=f"connect to {sandbox_id}")
    except exc.NotFoundException as e:
        raise _not_found(e, sandbox_id) from e


def file_signature(path: str, operation: str, user: str, token: str, expiration: Optional[int]) -> str:
    """The signature of a /files URL, as E2B's SDKs make it (envd checks it)."""
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration is not None else "")
    return "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _not_found(e: exc.NotFoundException, sandbox_id: str) -> exc.SandboxNotFoundException:
    return exc.SandboxNotFoundException(f"sandbox {sandbox_id} not found: {e.message}", status_code=404,
                                        error_code=e.error_code, reason=e.reason)


def _list_params(query: Optional[SandboxQuery], order: Optional[str]) -> Dict[str, str]:
    """The query of GET /v2/sandboxes as E2B's SDK sends it."""
    params: Dict[str, str] = {}
    if order is not None:
        if order not in ("asc", "desc"):
            raise exc.InvalidArgumentException(f"order {order!r}: use 'asc' or 'desc'")
        params["order"] = order
    if not query:
        return params
    if query.metadata:
        params["metadata"] = urllib.parse.urlencode(
            {urllib.parse.quote(k): urllib.parse.quote(v) for k, v in query.metadata.items()})
    if query.state:
        params["state"] = ",".join(str(getattr(v, "value", v)) for v in query.state)
    if query.started_after:
        params["startedAfter"] = query.started_after.astimezone().isoformat()
    if query.template:
        params["template"] = query.template
    return params


def _lifecycle_body(lifecycle: Optional[SandboxLifecycle]) -> Dict[str, Any]:
    """E2B's lifecycle option as the create body's autoPause, autoPauseMemory
    and autoResume; fields left unset are left to the server, as E2B's SDK does."""
    if not lifecycle:
        return {}
    raw = lifecycle.get("on_timeout")
    keep_memory: Optional[bool] = None
    action = raw
    if isinstance(raw, dict):
        action = raw.get("action", "kill")
        keep_memory = raw.get("keep_memory")
        if "keep_memory" in raw and action != "pause":
            raise exc.InvalidArgumentException("keep_memory is only allowed when the on_timeout action is 'pause'")
    if action is not None and action not in ("pause", "kill"):
        raise exc.InvalidArgumentException(f"on_timeout {action!r}: use 'pause' or 'kill'")
    auto_resume = lifecycle.get("auto_resume")
    if auto_resume and action != "pause":
        raise exc.InvalidArgumentException("auto_resume can only be True when on_timeout is 'pause'")
    if auto_resume and keep_memory is False:
        raise exc.InvalidArgumentException(
            "auto_resume cannot go with keep_memory False: a sandbox paused without memory is resumed "
            "by connect() only")
    body: Dict[str, Any] = {}
    if action is not None:
        body["autoPause"] = action == "pause"
    if keep_memory is not None:
        body["autoPauseMemory"] = bool(keep_memory)
    if auto_resume is not None:
        body["autoResume"] = {"enabled": bool(auto_resume)}
    return body


class Sandbox:
    """An isolated gVisor sandbox. Make one with ``Sandbox.create()``.

    Thread-safe: one process may drive many sandboxes from many threads.
    Used as a context manager, the sandbox is killed on exit.
    """

    def __init__(self, sandbox_id: str, envd_access_token: Optional[str], connection_config: ConnectionConfig,
                 sandbox_domain: Optional[str] = None):
        self._sandbox_id = sandbox_id
        self._connection_config = connection_config
        self._envd_access_token = envd_access_token
        self._sandbox_domain = sandbox_domain or connection_config.domain
        self._envd = EnvdConnection(connection_config, sandbox_id, envd_access_token)
        self._commands = Commands(self._envd)
        self._filesystem = Filesystem(self._envd)
        self._pty = Pty(self._commands)

    # -- properties ------------------------------------------------------

    @property
    def sandbox_id(self) -> str:
        return self._sandbox_id

    @property
    def commands(self) -> Commands:
        return self._commands

    @property
    def files(self) -> Filesystem:
        return self._filesystem

    @property
    def pty(self) -> Pty:
        return self._pty

    @property
    def connection_config(self) -> ConnectionConfig:
        return self._connection_config

    @property
    def envd_api_url(self) -> str:
        return self._envd.base

    @property
    def sandbox_domain(self) -> Optional[str]:
        """The domain of this sandbox's hosts (``<port>-<id>.<domain>``): the
        server's answer, else ``domain=`` / ``E2B_DOMAIN``."""
        return self._sandbox_domain

    # -- URLs (E2B's get_host, download_url, upload_url) -------------------

    def get_host(self, port: int) -> str:
        """The host of a port in the sandbox, ``<port>-<sandbox_id>.<domain>``:
        ``https://`` + it reaches a server listening there (a server
        started with ``--domain``; trust its CA with ``SSL_CERT_FILE``)."""
        if self._connection_config.debug:
            return f"localhost:{port}"
        if not self._sandbox_domain:
            raise exc.SandboxException("the server gave no domain for sandbox hosts: start it with --domain, "
                                       "or pass domain= / set E2B_DOMAIN")
        return f"{int(port)}-{self._sandbox_id}.{self._sandbox_domain}"

    def _file_url(self, path: Optional[str], operation: str, user: Optional[str],
                  use_signature_expiration: Optional[int]) -> str:
        # As E2B's SDK with E2B_SANDBOX_URL set: the sandbox proxy's /files,
        # signed with the sandbox's envd token; the proxy finds the sandbox
        # by the signature.
        q: Dict[str, Optional[str]] = {"path": path or None, "username": user or None}
        if self._envd_access_token:
            expiration = None
            if use_signature_expiration is not None:
                expiration = int(_dt.datetime.now(_dt.timezone.utc).timestamp()) + int(use_signature_expiration)
            q["signature"] = file_signature(path or "", operation, user or "", self._envd_access_token, expiration)
            if expiration is not None:
                q["signature_expiration"] = str(expiration)
        elif use_signature_expiration is not None:
            raise exc.InvalidArgumentException("Signature expiration can be used only when sandbox is created as secured.")
        return self._envd.base + "/files?" + urllib.parse.urlencode(
            {k: v for k, v in q.items() if v is not None}, quote_via=urllib.parse.quote)

    def download_url(self, path: str, user: Optional[str] = None,
                     use_signature_expiration: Optional[int] = None) -> str:
        """A URL that downloads the file with a plain GET, signed with the
        sandbox's token; ``use_signature_expiration`` (seconds) makes it expire."""
        return self._file_url(path, "read", user, use_signature_expiration)

    def upload_url(self, path: Optional[str] = None, user: Optional[str] = None,
                   use_signature_expiration: Optional[int] = None) -> str:
        """A URL that uploads a file with a multipart/form-data POST (field
        ``file``), signed as ``download_url``."""
        return self._file_url(path, "write", user, use_signature_expiration)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(sandbox_id={self._sandbox_id!r})"

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.kill()

    # -- create, connect, list -------------------------------------------

    @classmethod
    def create(cls: Type[S], template: Optional[str] = None, timeout: Optional[int] = None,
               metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
               secure: bool = True, allow_internet_access: bool = True,
               lifecycle: Optional[SandboxLifecycle] = None, network: Optional[Dict[str, Any]] = None,
               memory_mb: Optional[int] = None, cpu_count: Optional[int] = None, **opts: Any) -> S:
        """Creates a sandbox from a template (or a snapshot ID).

        :param template: template name, or a snapshot ID; default "base"
        :param timeout: seconds the sandbox lives (default 300); ``set_timeout`` changes it
        :param metadata: key/value pairs to find it by (``Sandbox.list``)
        :param envs: environment variables of every command
        :param allow_internet_access: egress to the internet (default on)
        :param lifecycle: what the timeout does, as E2B's: ``{"on_timeout": "pause",
            "auto_resume": True}``, or ``{"on_timeout": {"action": "pause", "keep_memory": False}}``
            (default: kill)
        :param network: E2B's egress lists: ``{"allow_out": ["10.0.0.5"], "deny_out": ["1.1.1.1/32"],
            "allow_public_traffic": False}`` (allow wins over deny)
        :param memory_mb: memory in MiB (agentenv's; default the template's, else the server's
            512); the server refuses more than its maximum
        :param cpu_count: CPUs (agentenv's; default the template's, else the server's 2)
        :param opts: ``api_key``, ``api_url``, ``sandbox_url``, ``request_timeout``, ``domain``,
            ``debug``; any other keyword raises ``TypeError``
        """
        Sandbox.check_create_options({k: v for k, v in opts.items() if k not in _CONNECTION_OPTS})
        config = _config(opts, "Sandbox.create()")
        body: Dict[str, Any] = {"templateID": template or DEFAULT_TEMPLATE,
                                "timeout": int(timeout or DEFAULT_SANDBOX_TIMEOUT),
                                "allow_internet_access": allow_internet_access}
        if metadata:
            body["metadata"] = metadata
        if envs:
            body["envVars"] = envs
        body.update(_lifecycle_body(lifecycle))
        body.update(_network_body(network))
        body.update(_size_body(memory_mb, cpu_count))
        d = config.api("POST", "/sandboxes", body, what="create sandbox")
        return cls._from_json(d, config)  # type: ignore[arg-type]

    @staticmethod
    def check_create_options(opts: Dict[str, Any], what: str = "Sandbox.create()",
                             taken: Tuple[str, ...] = ()) -> None:
        """Raises ``TypeError`` for a keyword in ``opts`` that ``create`` does
        not take, or that the caller sets itself (``taken``), so that code
        holding options for later creates (``agentenv.rl.SandboxEnv``) fails
        when it is given them."""
        for k in taken:
            if k in opts:
                raise TypeError(f"{what} sets {k} itself: leave {k!r} out of the create options")
        named = [p for p in inspect.signature(Sandbox.create).parameters if p not in ("template", "opts") + taken]
        unknown = sorted(set(opts) - set(named) - set(_CONNECTION_OPTS))
        if unknown:
            raise TypeError(f"{what} got an unexpected keyword argument {unknown[0]!r} "
                            f"(create options are {', '.join(named + list(_CONNECTION_OPTS))})")

    @classmethod
    def _from_json(cls: Type[S], d: Dict[str, Any], config: ConnectionConfig) -> S:
        return cls(d["sandboxID"], d.get("envdAccessToken"), config, d.get("domain"))

    def _connect(self: S, timeout: Optional[int] = None, **opts: Any) -> S:
        """Connects again (resuming the sandbox if it is paused); returns self."""
        _connect(self._connection_config, self._sandbox_id, timeout)
        return self

    def _cls_connect(cls: Type[S], sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> S:
        """Connects to a running or paused sandbox, resuming it if it is paused.
        ``timeout`` only ever extends the sandbox's life."""
        config = _config(opts)
        return cls._from_json(_connect(config, sandbox_id, timeout), config)

    connect = _either(_connect, _cls_connect)

    @staticmethod
    def list(query: Optional[SandboxQuery] = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             order: Optional[str] = None, **opts: Any) -> "Paginator[SandboxInfo]":
        """Lists sandboxes (running and paused unless ``query.state`` says),
        newest first unless ``order="asc"``. Returns a paginator:
        ``next_items()`` gives one page of at most ``limit`` (server default
        100) while ``has_next``; iterating it gives every remaining sandbox.
        """
        config = _config(opts)
        params = _list_params(query, order)
        if limit:
            params["limit"] = str(int(limit))

        def fetch(token: Optional[str]) -> Tuple[List[SandboxInfo], Optional[str]]:
            q = dict(params, **({"nextToken": token} if token else {}))
            path = "/v2/sandboxes" + ("?" + urllib.parse.urlencode(q) if q else "")
            docs, nxt = config.api_page("GET", path, what="list sandboxes")
            return [SandboxInfo.from_json(d) for d in docs or []], nxt  # type: ignore[union-attr]

        return Paginator(fetch, limit, next_token)

    # -- lifecycle (instance, or class with a sandbox ID) ------------------

    def _kill(self, request_timeout: Optional[float] = None) -> bool:
        """Kills the sandbox; False if it was not found."""
        return _kill(self._connection_config, self._sandbox_id, request_timeout)

    def _cls_kill(cls, sandbox_id: str, request_timeout: Optional[float] = None, **opts: Any) -> bool:
        return _kill(_config(opts), sandbox_id, request_timeout)

    kill = _either(_kill, _cls_kill)

    def _set_timeout(self, timeout: int, request_timeout: Optional[float] = None) -> None:
        """Sets how many seconds from now the sandbox lives; at its end it is
        killed, or paused with ``lifecycle={"on_timeout": "pause"}``. 0 ends it now."""
        Sandbox._cls_set_timeout(type(self), self._sandbox_id, timeout, request_timeout,
                                 _config_obj=self._connection_config)

    def _cls_set_timeout(cls, sandbox_id: str, timeout: int, request_timeout: Optional[float] = None,
                         _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> None:
        config = _config_obj or _config(opts)
        try:
            config.api("POST", f"/sandboxes/{_q(sandbox_id)}/timeout", {"timeout": int(timeout)},
                       request_timeout=request_timeout, what=f"set timeout of {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e

    set_timeout = _either(_set_timeout, _cls_set_timeout)

    def _get_info(self, request_timeout: Optional[float] = None) -> SandboxInfo:
        """The sandbox's details."""
        return Sandbox._cls_get_info(type(self), self._sandbox_id, request_timeout, _config_obj=self._connection_config)

    def _cls_get_info(cls, sandbox_id: str, request_timeout: Optional[float] = None,
                      _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> SandboxInfo:
        config = _config_obj or _config(opts)
        try:
            d = config.api("GET", "/sandboxes/" + _q(sandbox_id), request_timeout=request_timeout,
                           what=f"get sandbox {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e
        return SandboxInfo.from_json(d)  # type: ignore[arg-type]

    get_info = _either(_get_info, _cls_get_info)

    def _get_metrics(self, start: Optional[_dt.datetime] = None, end: Optional[_dt.datetime] = None,
                     request_timeout: Optional[float] = None) -> List[SandboxMetrics]:
        """Samples of the sandbox's CPU, memory and disk use between ``start``
        and ``end`` (agentenv samples on request: the list holds the current
        sample; it is empty for a sandbox paused without its memory)."""
        return Sandbox._cls_get_metrics(type(self), self._sandbox_id, start, end, request_timeout,
                                        _config_obj=self._connection_config)

    def _cls_get_metrics(cls, sandbox_id: str, start: Optional[_dt.datetime] = None,
                         end: Optional[_dt.datetime] = None, request_timeout: Optional[float] = None,
                         _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> List[SandboxMetrics]:
        config = _config_obj or _config(opts)
        params = {k: str(int(t.timestamp())) for k, t in (("start", start), ("end", end)) if t}
        path = f"/sandboxes/{_q(sandbox_id)}/metrics" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            docs = config.api("GET", path, request_timeout=request_timeout, what=f"metrics of {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e
        return [SandboxMetrics.from_json(d) for d in docs or []]  # type: ignore[union-attr]

    get_metrics = _either(_get_metrics, _cls_get_metrics)

    def _pause(self, keep_memory: bool = True, request_timeout: Optional[float] = None) -> bool:
        """Pauses the sandbox; ``connect`` resumes it. With ``keep_memory=False``
        only its files are kept: the resume boots afresh (no processes).
        False if it was already paused."""
        return Sandbox._cls_pause(type(self), self._sandbox_id, keep_memory, request_timeout,
                                  _config_obj=self._connection_config)

    def _cls_pause(cls, sandbox_id: str, keep_memory: bool = True, request_timeout: Optional[float] = None,
                   _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> bool:
        config = _config_obj or _config(opts)
        try:
            config.api("POST", f"/sandboxes/{_q(sandbox_id)}/pause", {"memory": bool(keep_memory)},
                       request_timeout=request_timeout, what=f"pause {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e
        except exc.ConflictException:
            return False
        return True

    pause = _either(_pause, _cls_pause)

    def is_running(self, request_timeout: Optional[float] = None) -> bool:
        """Whether the sandbox's envd answers."""
        t = self._envd.transport
        try:
            resp = t.request("GET", self._envd.base + "/health", dict(self._envd.headers),
                             timeout=self._connection_config.timeout(request_timeout))
        except exc.TimeoutException:
            return False
        resp.read()
        return resp.status < 300

    # -- snapshots and fork ----------------------------------------------

    def _create_snapshot(self, name: Optional[str] = None, metadata: Optional[Dict[str, str]] = None,
                         request_timeout: Optional[float] = None) -> SnapshotInfo:
        """Snapshots the running sandbox (memory, processes, files); it keeps running.
        ``Sandbox.create(snapshot.snapshot_id)`` starts a sandbox from it."""
        return Sandbox._cls_create_snapshot(type(self), self._sandbox_id, name, metadata, request_timeout,
                                            _config_obj=self._connection_config)

    def _cls_create_snapshot(cls, sandbox_id: str, name: Optional[str] = None,
                             metadata: Optional[Dict[str, str]] = None, request_timeout: Optional[float] = None,
                             _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> SnapshotInfo:
        config = _config_obj or _config(opts)
        body: Dict[str, Any] = {}
        if name:
            body["name"] = name
        if metadata:
            body["metadata"] = metadata
        try:
            d = config.api("POST", f"/sandboxes/{_q(sandbox_id)}/snapshots", body,
                           request_timeout=request_timeout, what=f"snapshot {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e
        return SnapshotInfo.from_json(d)  # type: ignore[arg-type]

    create_snapshot = _either(_create_snapshot, _cls_create_snapshot)

    def _list_snapshots(self, **opts: Any) -> Paginator[SnapshotInfo]:
        """This sandbox's snapshots."""
        return Sandbox._cls_list_snapshots(type(self), self._sandbox_id, _config_obj=self._connection_config)

    def _cls_list_snapshots(cls, sandbox_id: Optional[str] = None, _config_obj: Optional[ConnectionConfig] = None,
                            **opts: Any) -> Paginator[SnapshotInfo]:
        """Lists snapshots, of one sandbox when ``sandbox_id`` is given."""
        config = _config_obj or _config(opts)
        params = {"sandboxID": sandbox_id} if sandbox_id else {}

        def fetch(token: Optional[str]) -> Tuple[List[SnapshotInfo], Optional[str]]:
            q = dict(params, **({"nextToken": token} if token else {}))
            path = "/snapshots" + ("?" + urllib.parse.urlencode(q) if q else "")
            docs, nxt = config.api_page("GET", path, what="list snapshots")
            return [SnapshotInfo.from_json(d) for d in docs or []], nxt  # type: ignore[union-attr]

        return Paginator(fetch)

    list_snapshots = _either(_list_snapshots, _cls_list_snapshots)

    @staticmethod
    def delete_snapshot(snapshot_id: str, **opts: Any) -> bool:
        """Deletes a snapshot; False if there was none."""
        try:
            _config(opts).api("DELETE", "/snapshots/" + _q(snapshot_id), what=f"delete snapshot {snapshot_id}")
        except exc.NotFoundException:
            return False
        return True

    @_fork_timeout_warning(1)
    def _fork(self: S, timeout: Optional[int] = None, count: Optional[int] = None,
              metadata: Optional[Dict[str, str]] = None, **opts: Any) -> List[Union[S, Exception]]:
        """Forks the running sandbox into ``count`` children (default 1), as E2B's ``fork``.

        Each child continues from the parent's state (memory, processes,
        files) and is isolated from it and from the others; the parent goes
        on. Returns one entry per child: a ``Sandbox``, or the exception
        saying why that child failed. Note the order: ``fork(count=8)``,
        since the first argument is the children's ``timeout`` in seconds
        (a positional one under 10 s warns).
        """
        return Sandbox._cls_fork(type(self), self._sandbox_id, timeout=timeout, count=count, metadata=metadata,
                                 _config_obj=self._connection_config)

    @_fork_timeout_warning(2)
    def _cls_fork(cls: Type[S], sandbox_id: str, timeout: Optional[int] = None, count: Optional[int] = None,
                  metadata: Optional[Dict[str, str]] = None, _config_obj: Optional[ConnectionConfig] = None,
                  **opts: Any) -> List[Union[S, Exception]]:
        config = _config_obj or _config(opts)
        count = 1 if count is None else count
        if count < 1:
            raise exc.InvalidArgumentException("count must be at least 1")
        body: Dict[str, Any] = {"count": count, "timeout": int(timeout or DEFAULT_SANDBOX_TIMEOUT)}
        if metadata:
            body["metadata"] = metadata
        try:
            out = config.api("POST", f"/sandboxes/{_q(sandbox_id)}/fork", body,
                             request_timeout=max(config.request_timeout, 120.0), what=f"fork {sandbox_id}")
        except exc.NotFoundException as e:
            raise _not_found(e, sandbox_id) from e
        results: List[Union[S, Exception]] = []
        for o in out or []:  # type: ignore[union-attr]
            if o.get("sandbox"):
                results.append(cls._from_json(o["sandbox"], config))
                continue
            err = o.get("error") or {}
            status = int(err.get("code") or 500)
            results.append(error_from_http(status, json.dumps(err).encode(), f"fork child of {sandbox_id}"))
        return results

    fork = _either(_fork, _cls_fork)
