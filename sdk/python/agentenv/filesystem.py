"""``sbx.files``: read, write, list and watch files through envd.

File contents travel over envd's HTTP ``/files`` route and are streamed
both ways (chunked uploads, chunked reads), so large files never have to
sit in memory whole unless the caller asks for them whole.
"""

from __future__ import annotations

from typing import IO, Any, Dict, Iterator, List, Literal, Optional, Union, overload

from . import exceptions as exc
from ._transport import basic_user, connect_unary, error_from_http, query, read_json
from .config import EnvdConnection
from .models import EntryInfo, FilesystemEvent, FileType, WriteEntry, WriteInfo

_SERVICE = "filesystem.Filesystem/"

WriteData = Union[str, bytes, bytearray, IO[bytes], IO[str]]


class WatchHandle:
    """A directory watch: ``get_new_events()`` returns what changed since the last call."""

    def __init__(self, fs: "Filesystem", watcher_id: str):
        self._fs, self._id = fs, watcher_id

    def get_new_events(self) -> List[FilesystemEvent]:
        out = self._fs._rpc("GetWatcherEvents", {"watcherId": self._id}, None, None)
        return [FilesystemEvent.from_json(e) for e in out.get("events", [])]

    def stop(self) -> None:
        self._fs._rpc("RemoveWatcher", {"watcherId": self._id}, None, None)


class Filesystem:
    """The sandbox's filesystem (``sbx.files``)."""

    def __init__(self, envd: EnvdConnection):
        self._envd = envd

    def _rpc(self, method: str, msg: Dict[str, Any], user: Optional[str], request_timeout: Optional[float]) -> Dict[str, Any]:
        h = dict(self._envd.headers, **basic_user(user))
        try:
            return connect_unary(self._envd.transport, self._envd.base, h, _SERVICE + method, msg,
                                 self._envd.config.timeout(request_timeout), self._envd.explain)
        except exc.NotFoundException as e:
            raise _file_not_found(e) from e

    def _files_url(self, path: str, user: Optional[str]) -> str:
        return self._envd.base + "/files?" + query({"path": path, "username": user})

    @overload
    def read(self, path: str, format: Literal["text"] = "text", user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"], user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> bytearray: ...

    @overload
    def read(self, path: str, format: Literal["stream"], user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> Iterator[bytes]: ...

    def read(self, path: str, format: str = "text", user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> Any:
        """Reads a file: ``format`` "text" (str), "bytes" (bytearray) or "stream" (iterator of chunks)."""
        if format not in ("text", "bytes", "stream"):
            raise exc.InvalidArgumentException(f'format {format!r}: use "text", "bytes" or "stream"')
        resp = self._envd.transport.request("GET", self._files_url(path, user), dict(self._envd.headers),
                                            timeout=self._envd.config.timeout(request_timeout))
        if resp.status != 200:
            err = error_from_http(resp.status, resp.read(), f"read {path}")
            raise _file_not_found(err) if isinstance(err, exc.NotFoundException) else self._envd.explain(err)
        if format == "stream":
            return resp.iter_chunks()
        data = resp.read()
        return data.decode("utf-8") if format == "text" else bytearray(data)

    def write(self, path: str, data: WriteData, user: Optional[str] = None,
              request_timeout: Optional[float] = None, metadata: Optional[Dict[str, str]] = None) -> WriteInfo:
        """Writes a file (parents are created); file objects are streamed in chunks.
        ``metadata`` is stored on the file (extended attributes; keys are lowercased,
        printable ASCII only) and replaces what it had; ``get_info``/``list`` show it."""
        _check_metadata(metadata)
        body: Any
        if isinstance(data, str):
            body = data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            body = bytes(data)
        elif hasattr(data, "read"):
            body = _binary(data)
        else:
            raise exc.InvalidArgumentException(f"data of type {type(data).__name__}: give str, bytes or a file object")
        h = dict(self._envd.headers)
        h["Content-Type"] = "application/octet-stream"
        for k, v in (metadata or {}).items():
            h["X-Metadata-" + k] = v
        resp = self._envd.transport.request("POST", self._files_url(path, user), h, body,
                                            timeout=self._envd.config.timeout(request_timeout))
        try:
            out = read_json(resp, f"write {path}") or []
        except exc.SandboxException as err:
            raise self._envd.explain(err)
        if not out:
            raise exc.SandboxException(f"write {path}: envd answered without the written file")
        e = out[0]
        return WriteInfo(name=e.get("name", ""), type=FileType.DIR if e.get("type") == "dir" else FileType.FILE,
                         path=e.get("path", path), metadata=e.get("metadata") or None)

    def write_files(self, files: List[WriteEntry], user: Optional[str] = None,
                    request_timeout: Optional[float] = None,
                    metadata: Optional[Dict[str, str]] = None) -> List[WriteInfo]:
        """Writes several files (``metadata`` goes on each)."""
        _check_metadata(metadata)
        return [self.write(f.path, f.data, user=user, request_timeout=request_timeout, metadata=metadata)
                for f in files]

    def list(self, path: str, depth: Optional[int] = 1, user: Optional[str] = None,
             request_timeout: Optional[float] = None) -> List[EntryInfo]:
        """Lists a directory, ``depth`` levels deep."""
        if depth is not None and depth < 1:
            raise exc.InvalidArgumentException("depth should be at least 1")
        out = self._rpc("ListDir", {"path": path, "depth": depth or 1}, user, request_timeout)
        return [EntryInfo.from_json(e) for e in out.get("entries", [])]

    def exists(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        try:
            self._rpc("Stat", {"path": path}, user, request_timeout)
        except exc.NotFoundException:
            return False
        return True

    def get_info(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> EntryInfo:
        return EntryInfo.from_json(self._rpc("Stat", {"path": path}, user, request_timeout).get("entry") or {})

    def remove(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> None:
        """Removes a file or a directory (with its contents)."""
        self._rpc("Remove", {"path": path}, user, request_timeout)

    def rename(self, old_path: str, new_path: str, user: Optional[str] = None,
               request_timeout: Optional[float] = None) -> EntryInfo:
        out = self._rpc("Move", {"source": old_path, "destination": new_path}, user, request_timeout)
        return EntryInfo.from_json(out.get("entry") or {})

    def make_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None) -> bool:
        """Creates a directory and its parents; False if it already existed."""
        try:
            self._rpc("MakeDir", {"path": path}, user, request_timeout)
        except exc.ConflictException:
            return False
        return True

    def watch_dir(self, path: str, user: Optional[str] = None, request_timeout: Optional[float] = None,
                  recursive: bool = False, include_entry: bool = False) -> WatchHandle:
        """Starts watching a directory; poll the handle's ``get_new_events()``.
        ``include_entry`` gives each event the ``EntryInfo`` at its path."""
        out = self._rpc("CreateWatcher", {"path": path, "recursive": recursive, "includeEntry": include_entry},
                        user, request_timeout)
        return WatchHandle(self, out["watcherId"])


def _check_metadata(md: Optional[Dict[str, str]]) -> None:
    """Refuses metadata an HTTP header cannot carry intact (envd checks the rest)."""
    for k, v in (md or {}).items():
        for what, s in (("key", k), (f"value of {k!r}", v)):
            if not isinstance(s, str) or not s and what == "key" or any(not 0x20 <= ord(c) <= 0x7e for c in s):
                raise exc.InvalidArgumentException(
                    f"metadata {what} {s!r}: use non-empty keys and values of printable US-ASCII")
        if any(c in k for c in " :()<>@,;\\\"/[]?={}"):
            raise exc.InvalidArgumentException(f"metadata key {k!r}: use letters, digits, '-', '_' or '.'")


def _file_not_found(e: exc.NotFoundException) -> exc.NotFoundException:
    if isinstance(e, exc.FileNotFoundException):
        return e
    return exc.FileNotFoundException(e.message, status_code=e.status_code, error_code=e.error_code, reason=e.reason)


def _binary(f: Any) -> Iterator[bytes]:
    while True:
        chunk = f.read(1 << 16)
        if not chunk:
            return
        yield chunk.encode() if isinstance(chunk, str) else chunk

