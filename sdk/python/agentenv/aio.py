"""``AsyncSandbox``: the same API as ``Sandbox``, on asyncio.

Each call runs the blocking standard-library client in a thread of a pool
owned by this module (not asyncio's default executor, which has only
``cpu + 4`` threads and would serialize many sandboxes). Callbacks may be
plain functions or coroutine functions; coroutines run on the caller's loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import functools
import inspect
from typing import Any, AsyncIterator, Callable, Dict, Generic, List, Optional, Tuple, Type, TypeVar, Union

from .commands import CommandHandle, Commands
from .filesystem import Filesystem, WatchHandle
from .models import (CommandResult, EntryInfo, FilesystemEvent, ProcessInfo, SandboxInfo, SandboxMetrics, SnapshotInfo,
                     WriteInfo)
from .pty import Pty, PtySize
from .sandbox import Paginator, Sandbox, _fork_timeout_warning

T = TypeVar("T")
A = TypeVar("A", bound="AsyncSandbox")

_pool = concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="agentenv-aio")


async def _run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_pool, functools.partial(fn, *args, **kwargs))


def _callback(cb: Optional[Callable[[str], Any]], loop: asyncio.AbstractEventLoop) -> Optional[Callable[[str], Any]]:
    """Makes a (possibly async) callback callable from the reader thread, in order."""
    if cb is None:
        return None
    if inspect.iscoroutinefunction(cb):
        return lambda s: asyncio.run_coroutine_threadsafe(cb(s), loop).result()
    return lambda s: loop.call_soon_threadsafe(cb, s)


class AsyncCommandHandle:
    """A started command (``await handle.wait()``, ``await handle.kill()``)."""

    def __init__(self, handle: CommandHandle):
        self._h = handle

    @property
    def pid(self) -> int:
        return self._h.pid

    @property
    def stdout(self) -> str:
        return self._h.stdout

    @property
    def stderr(self) -> str:
        return self._h.stderr

    @property
    def exit_code(self) -> Optional[int]:
        return self._h.exit_code

    @property
    def stdout_truncated(self) -> bool:
        return self._h.stdout_truncated

    @property
    def stderr_truncated(self) -> bool:
        return self._h.stderr_truncated

    async def wait(self) -> CommandResult:
        return await _run(self._h.wait)

    async def kill(self) -> bool:
        return await _run(self._h.kill)

    async def disconnect(self) -> None:
        self._h.disconnect()

    def __aiter__(self) -> AsyncIterator[Tuple[Optional[str], Optional[str], Optional[bytes]]]:
        """``async for stdout, stderr, pty in handle``: chunks from the start, as they come."""
        it = iter(self._h)

        async def chunks() -> AsyncIterator[Tuple[Optional[str], Optional[str], Optional[bytes]]]:
            while True:
                item = await _run(next, it, None)
                if item is None:
                    return
                yield item

        return chunks()


class AsyncCommands:
    def __init__(self, sync: Commands):
        self._s = sync

    async def run(self, cmd: str, background: bool = False, envs: Optional[Dict[str, str]] = None,
                  user: Optional[str] = None, cwd: Optional[str] = None,
                  on_stdout: Optional[Callable[[str], Any]] = None, on_stderr: Optional[Callable[[str], Any]] = None,
                  stdin: Optional[bool] = None, timeout: Optional[float] = 60,
                  request_timeout: Optional[float] = None, max_output: Optional[int] = None) -> Any:
        """As ``Commands.run``: a ``CommandResult``, or an ``AsyncCommandHandle`` with ``background=True``."""
        loop = asyncio.get_running_loop()
        h = await _run(self._s.run, cmd, background=True, envs=envs, user=user, cwd=cwd,
                       on_stdout=_callback(on_stdout, loop), on_stderr=_callback(on_stderr, loop), stdin=stdin,
                       timeout=timeout, request_timeout=request_timeout, max_output=max_output)
        handle = AsyncCommandHandle(h)
        if background:
            return handle
        res = await handle.wait()
        await asyncio.sleep(0)  # let call_soon_threadsafe callbacks run before returning
        return res

    async def connect(self, pid: int, timeout: Optional[float] = 60, request_timeout: Optional[float] = None,
                      on_stdout: Optional[Callable[[str], Any]] = None,
                      on_stderr: Optional[Callable[[str], Any]] = None) -> AsyncCommandHandle:
        loop = asyncio.get_running_loop()
        h = await _run(self._s.connect, pid, timeout=timeout, request_timeout=request_timeout,
                       on_stdout=_callback(on_stdout, loop), on_stderr=_callback(on_stderr, loop))
        return AsyncCommandHandle(h)

    async def list(self, request_timeout: Optional[float] = None) -> List[ProcessInfo]:
        return await _run(self._s.list, request_timeout=request_timeout)

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.kill, pid, request_timeout=request_timeout)

    async def send_stdin(self, pid: int, data: str, request_timeout: Optional[float] = None) -> None:
        await _run(self._s.send_stdin, pid, data, request_timeout=request_timeout)


class AsyncPty:
    """``sbx.pty`` on asyncio; ``on_data`` may be a coroutine function."""

    def __init__(self, sync: Pty):
        self._s = sync

    async def create(self, size: PtySize, on_data: Optional[Callable[[bytes], Any]] = None, user: Optional[str] = None,
                     cwd: Optional[str] = None, envs: Optional[Dict[str, str]] = None, timeout: Optional[float] = 60,
                     request_timeout: Optional[float] = None) -> AsyncCommandHandle:
        loop = asyncio.get_running_loop()
        h = await _run(self._s.create, size, user=user, cwd=cwd, envs=envs, timeout=timeout,
                       request_timeout=request_timeout, on_data=_callback(on_data, loop))
        return AsyncCommandHandle(h)

    async def connect(self, pid: int, on_data: Optional[Callable[[bytes], Any]] = None, timeout: Optional[float] = 60,
                      request_timeout: Optional[float] = None) -> AsyncCommandHandle:
        loop = asyncio.get_running_loop()
        h = await _run(self._s.connect, pid, timeout=timeout, request_timeout=request_timeout,
                       on_data=_callback(on_data, loop))
        return AsyncCommandHandle(h)

    async def send_stdin(self, pid: int, data: bytes, request_timeout: Optional[float] = None) -> None:
        await _run(self._s.send_stdin, pid, data, request_timeout=request_timeout)

    async def resize(self, pid: int, size: PtySize, request_timeout: Optional[float] = None) -> None:
        await _run(self._s.resize, pid, size, request_timeout=request_timeout)

    async def kill(self, pid: int, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.kill, pid, request_timeout=request_timeout)


class AsyncWatchHandle:
    """A directory watch that calls ``on_event`` for every change until ``stop()``."""

    def __init__(self, handle: WatchHandle, on_event: Callable[[FilesystemEvent], Any], interval: float = 0.1):
        self._h, self._on_event = handle, on_event
        self._task = asyncio.get_running_loop().create_task(self._poll(interval))

    async def _poll(self, interval: float) -> None:
        while True:
            for ev in await _run(self._h.get_new_events):
                r = self._on_event(ev)
                if inspect.isawaitable(r):
                    await r
            await asyncio.sleep(interval)

    async def stop(self) -> None:
        self._task.cancel()
        await _run(self._h.stop)


class AsyncFilesystem:
    def __init__(self, sync: Filesystem):
        self._s = sync

    async def read(self, path: str, format: str = "text", user: Optional[str] = None,
                   request_timeout: Optional[float] = None) -> Any:
        return await _run(self._s.read, path, format, user=user, request_timeout=request_timeout)

    async def write(self, path: str, data: Any, user: Optional[str] = None,
                    request_timeout: Optional[float] = None, metadata: Optional[Dict[str, str]] = None) -> WriteInfo:
        return await _run(self._s.write, path, data, user=user, request_timeout=request_timeout, metadata=metadata)

    async def write_files(self, files: List[Any], user: Optional[str] = None, request_timeout: Optional[float] = None,
                          metadata: Optional[Dict[str, str]] = None) -> List[WriteInfo]:
        return await _run(self._s.write_files, files, user=user, request_timeout=request_timeout, metadata=metadata)

    async def list(self, path: str, depth: Optional[int] = 1, user: Optional[str] = None,
                   request_timeout: Optional[float] = None) -> List[EntryInfo]:
        return await _run(self._s.list, path, depth, user=user, request_timeout=request_timeout)

    async def exists(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.exists, path, user=user, request_timeout=request_timeout)

    async def get_info(self, path: str, user: Optional[str] = None,
                       request_timeout: Optional[float] = None) -> EntryInfo:
        return await _run(self._s.get_info, path, user=user, request_timeout=request_timeout)

    async def remove(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> None:
        await _run(self._s.remove, path, user=user, request_timeout=request_timeout)

    async def rename(self, old_path: str, new_path: str, user: Optional[str] = None,
                     request_timeout: Optional[float] = None) -> EntryInfo:
        return await _run(self._s.rename, old_path, new_path, user=user, request_timeout=request_timeout)

    async def make_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.make_dir, path, user=user, request_timeout=request_timeout)

    async def watch_dir(self, path: str, on_event: Callable[[FilesystemEvent], Any], user: Optional[str] = None,
                        request_timeout: Optional[float] = None, recursive: bool = False,
                        include_entry: bool = False) -> AsyncWatchHandle:
        """Watches a directory, calling ``on_event`` (function or coroutine) per change."""
        h = await _run(self._s.watch_dir, path, user=user, request_timeout=request_timeout, recursive=recursive,
                       include_entry=include_entry)
        return AsyncWatchHandle(h, on_event)


class AsyncPaginator(Generic[T]):
    """E2B's async paginator: ``has_next``, ``next_token``, ``await next_items()``; ``async for`` walks the pages."""

    def __init__(self, sync: Paginator[T]):
        self._p = sync

    @property
    def has_next(self) -> bool:
        return self._p.has_next

    @property
    def next_token(self) -> Optional[str]:
        return self._p.next_token

    async def next_items(self) -> List[T]:
        return await _run(self._p.next_items)

    async def __aiter__(self) -> AsyncIterator[T]:
        while self._p.has_next:
            for item in await self.next_items():
                yield item


class AsyncSandbox:
    """``Sandbox`` on asyncio: ``sbx = await AsyncSandbox.create(...)``; ``async with`` kills on exit."""

    def __init__(self, sync: Sandbox):
        self._s = sync
        self._commands = AsyncCommands(sync.commands)
        self._files = AsyncFilesystem(sync.files)
        self._pty = AsyncPty(sync.pty)

    @property
    def sandbox_id(self) -> str:
        return self._s.sandbox_id

    @property
    def commands(self) -> AsyncCommands:
        return self._commands

    @property
    def files(self) -> AsyncFilesystem:
        return self._files

    @property
    def pty(self) -> AsyncPty:
        return self._pty

    @property
    def sandbox_domain(self) -> Optional[str]:
        return self._s.sandbox_domain

    def get_host(self, port: int) -> str:
        """See ``Sandbox.get_host``."""
        return self._s.get_host(port)

    def download_url(self, path: str, user: Optional[str] = None,
                     use_signature_expiration: Optional[int] = None) -> str:
        """See ``Sandbox.download_url`` (no I/O: not a coroutine, as E2B's)."""
        return self._s.download_url(path, user, use_signature_expiration)

    def upload_url(self, path: Optional[str] = None, user: Optional[str] = None,
                   use_signature_expiration: Optional[int] = None) -> str:
        """See ``Sandbox.upload_url``."""
        return self._s.upload_url(path, user, use_signature_expiration)

    @property
    def sync(self) -> Sandbox:
        """The blocking ``Sandbox`` over the same connection."""
        return self._s

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r})"

    async def __aenter__(self: A) -> A:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.kill()

    @classmethod
    async def create(cls: Type[A], template: Optional[str] = None, timeout: Optional[int] = None,
                     metadata: Optional[Dict[str, str]] = None, envs: Optional[Dict[str, str]] = None,
                     **opts: Any) -> A:
        """As ``Sandbox.create`` (the same options; an unknown keyword raises ``TypeError``)."""
        return cls(await _run(Sandbox.create, template, timeout, metadata, envs, **opts))

    @classmethod
    async def connect(cls: Type[A], sandbox_id: str, timeout: Optional[int] = None, **opts: Any) -> A:
        """Connects to a sandbox by ID, resuming it if it is paused."""
        return cls(await _run(Sandbox.connect, sandbox_id, timeout, **opts))

    @staticmethod
    def list(query: Any = None, limit: Optional[int] = None, next_token: Optional[str] = None,
             order: Optional[str] = None, **opts: Any) -> "AsyncPaginator[SandboxInfo]":
        """As ``Sandbox.list``; ``await paginator.next_items()`` gives a page,
        ``async for`` every remaining sandbox (as E2B's ``AsyncSandbox.list``)."""
        return AsyncPaginator(Sandbox.list(query, limit, next_token, order, **opts))

    async def kill(self, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.kill, request_timeout)

    async def set_timeout(self, timeout: int, request_timeout: Optional[float] = None) -> None:
        await _run(self._s.set_timeout, timeout, request_timeout)

    async def get_info(self, request_timeout: Optional[float] = None) -> SandboxInfo:
        return await _run(self._s.get_info, request_timeout)

    async def pause(self, keep_memory: bool = True, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.pause, keep_memory, request_timeout)

    async def get_metrics(self, start: Optional[datetime.datetime] = None, end: Optional[datetime.datetime] = None,
                          request_timeout: Optional[float] = None) -> List[SandboxMetrics]:
        return await _run(self._s.get_metrics, start, end, request_timeout)

    async def is_running(self, request_timeout: Optional[float] = None) -> bool:
        return await _run(self._s.is_running, request_timeout)

    async def create_snapshot(self, name: Optional[str] = None, metadata: Optional[Dict[str, str]] = None,
                              request_timeout: Optional[float] = None) -> SnapshotInfo:
        return await _run(self._s.create_snapshot, name, metadata, request_timeout)

    @staticmethod
    async def delete_snapshot(snapshot_id: str, **opts: Any) -> bool:
        return await _run(Sandbox.delete_snapshot, snapshot_id, **opts)

    @_fork_timeout_warning(1)
    async def fork(self, timeout: Optional[int] = None, count: Optional[int] = None,
                   metadata: Optional[Dict[str, str]] = None) -> List[Union["AsyncSandbox", Exception]]:
        """As ``Sandbox.fork``: one entry per child, an ``AsyncSandbox`` or an exception."""
        out = await _run(self._s.fork, timeout=timeout, count=count, metadata=metadata)
        return [AsyncSandbox(c) if isinstance(c, Sandbox) else c for c in out]


