"""``Sandbox``: create, connect to, list, pause, snapshot, fork and kill sandboxes.

The names and semantics are those of E2B's Python SDK (``e2b.Sandbox``);
``fork`` and the snapshot metadata are agentenv's own.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Type, TypeVar, Union

from . import exceptions as exc
from ._transport import error_from_http
from .commands import Commands
from .config import ConnectionConfig, EnvdConnection
from .filesystem import Filesystem
from .models import SandboxInfo, SandboxQuery, SnapshotInfo

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


class Paginator(Generic[T]):
    """E2B's paginator shape (``has_next``, ``next_items()``); also iterable.

    agentenv answers every item in one page.
    """

    def __init__(self, fetch: Callable[[], List[T]]):
        self._fetch = fetch
        self.has_next = True
        self.next_token: Optional[str] = None

    def next_items(self) -> List[T]:
        if not self.has_next:
            raise exc.SandboxException("no more items to fetch")
        self.has_next = False
        return self._fetch()

    def __iter__(self) -> Iterator[T]:
        while self.has_next:
            yield from self.next_items()


SandboxPaginator = Paginator
SnapshotPaginator = Paginator


def _config(opts: Dict[str, Any]) -> ConnectionConfig:
    keys = ("api_key", "api_url", "sandbox_url", "request_timeout", "domain", "debug")
    return ConnectionConfig(**{k: opts.get(k) for k in keys})


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


def _q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def _not_found(e: exc.NotFoundException, sandbox_id: str) -> exc.SandboxNotFoundException:
    return exc.SandboxNotFoundException(f"sandbox {sandbox_id} not found: {e.message}", status_code=404,
                                        error_code=e.error_code)


class Sandbox:
    """An isolated gVisor sandbox. Make one with ``Sandbox.create()``.

    Thread-safe: one process may drive many sandboxes from many threads.
    Used as a context manager, the sandbox is killed on exit.
    """

    def __init__(self, sandbox_id: str, envd_access_token: Optional[str], connection_config: ConnectionConfig):
        self._sandbox_id = sandbox_id
        self._connection_config = connection_config
        self._envd = EnvdConnection(connection_config, sandbox_id, envd_access_token)
        self._commands = Commands(self._envd)
        self._filesystem = Filesystem(self._envd)

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
    def connection_config(self) -> ConnectionConfig:
        return self._connection_config

    @property
    def envd_api_url(self) -> str:
        return self._envd.base

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
               secure: bool = True, allow_internet_access: bool = True, **opts: Any) -> S:
        """Creates a sandbox from a template (or a snapshot ID).

        :param template: template name, or a snapshot ID; default "base"
        :param timeout: seconds the sandbox lives (default 300); ``set_timeout`` changes it
        :param metadata: key/value pairs to find it by (``Sandbox.list``)
        :param envs: environment variables of every command
        :param opts: ``api_key``, ``api_url``, ``sandbox_url``, ``request_timeout``
        """
        config = _config(opts)
        body: Dict[str, Any] = {"templateID": template or DEFAULT_TEMPLATE,
                                "timeout": int(timeout or DEFAULT_SANDBOX_TIMEOUT),
                                "allow_internet_access": allow_internet_access}
        if metadata:
            body["metadata"] = metadata
        if envs:
            body["envVars"] = envs
        d = config.api("POST", "/sandboxes", body, what="create sandbox")
        return cls._from_json(d, config)  # type: ignore[arg-type]

    @classmethod
    def _from_json(cls: Type[S], d: Dict[str, Any], config: ConnectionConfig) -> S:
        return cls(d["sandboxID"], d.get("envdAccessToken"), config)

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
             **opts: Any) -> Paginator[SandboxInfo]:
        """Lists sandboxes (running and paused), optionally filtered by metadata and state."""
        config = _config(opts)
        params: Dict[str, str] = {}
        if query and query.metadata:
            params["metadata"] = urllib.parse.urlencode(
                {urllib.parse.quote(k): urllib.parse.quote(v) for k, v in query.metadata.items()})
        if query and query.state:
            params["state"] = ",".join(str(getattr(v, "value", v)) for v in query.state)
        path = "/v2/sandboxes" + ("?" + urllib.parse.urlencode(params) if params else "")

        def fetch() -> List[SandboxInfo]:
            items = [SandboxInfo.from_json(d) for d in config.api("GET", path, what="list sandboxes") or []]
            return items[:limit] if limit else items

        return Paginator(fetch)

    # -- lifecycle (instance, or class with a sandbox ID) ------------------

    def _kill(self, request_timeout: Optional[float] = None) -> bool:
        """Kills the sandbox; False if it was not found."""
        return _kill(self._connection_config, self._sandbox_id, request_timeout)

    def _cls_kill(cls, sandbox_id: str, request_timeout: Optional[float] = None, **opts: Any) -> bool:
        return _kill(_config(opts), sandbox_id, request_timeout)

    kill = _either(_kill, _cls_kill)

    def _set_timeout(self, timeout: int, request_timeout: Optional[float] = None) -> None:
        """Sets how many seconds from now the sandbox lives."""
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

    def _pause(self, keep_memory: bool = True, request_timeout: Optional[float] = None) -> bool:
        """Freezes the sandbox (memory kept); ``Sandbox.connect`` resumes it.
        False if it was already paused."""
        return Sandbox._cls_pause(type(self), self._sandbox_id, keep_memory, request_timeout,
                                  _config_obj=self._connection_config)

    def _cls_pause(cls, sandbox_id: str, keep_memory: bool = True, request_timeout: Optional[float] = None,
                   _config_obj: Optional[ConnectionConfig] = None, **opts: Any) -> bool:
        if not keep_memory:
            raise exc.InvalidArgumentException(
                "keep_memory=False is not supported: agentenv pauses keep the sandbox's memory")
        config = _config_obj or _config(opts)
        try:
            config.api("POST", f"/sandboxes/{_q(sandbox_id)}/pause", {}, request_timeout=request_timeout,
                       what=f"pause {sandbox_id}")
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
        path = "/snapshots" + ("?sandboxID=" + _q(sandbox_id) if sandbox_id else "")
        return Paginator(lambda: [SnapshotInfo.from_json(d) for d in config.api("GET", path) or []])

    list_snapshots = _either(_list_snapshots, _cls_list_snapshots)

    @staticmethod
    def delete_snapshot(snapshot_id: str, **opts: Any) -> bool:
        """Deletes a snapshot; False if there was none."""
        try:
            _config(opts).api("DELETE", "/snapshots/" + _q(snapshot_id), what=f"delete snapshot {snapshot_id}")
        except exc.NotFoundException:
            return False
        return True

    def _fork(self: S, timeout: Optional[int] = None, count: Optional[int] = None,
              metadata: Optional[Dict[str, str]] = None, **opts: Any) -> List[Union[S, Exception]]:
        """Forks the running sandbox into ``count`` children (default 1), as E2B's ``fork``.

        Each child continues from the parent's state (memory, processes,
        files) and is isolated from it and from the others; the parent goes
        on. Returns one entry per child: a ``Sandbox``, or the exception
        saying why that child failed. Note the order: ``fork(count=8)``,
        since the first argument is the children's ``timeout`` in seconds.
        """
        return Sandbox._cls_fork(type(self), self._sandbox_id, timeout, count, metadata,
                                 _config_obj=self._connection_config)

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
