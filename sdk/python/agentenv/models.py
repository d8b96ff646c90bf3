"""The values the SDK returns, named and shaped as in E2B's Python SDK."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, TypedDict, Union

from .exceptions import SandboxException


def _time(s: Optional[str]) -> Optional[_dt.datetime]:
    if not s:
        return None
    s = s.replace("Z", "+00:00")
    # Python 3.9/3.10 fromisoformat takes at most 6 fractional digits.
    if "." in s:
        head, rest = s.split(".", 1)
        digits = "".join(c for c in rest if c.isdigit())
        tz = rest[len(digits):]
        s = f"{head}.{digits[:6].ljust(6, '0')}{tz}"
    return _dt.datetime.fromisoformat(s)


class SandboxState(str, Enum):
    """State of a sandbox; compares equal to its string value."""

    PAUSED = "paused"
    RUNNING = "running"

    def __str__(self) -> str:
        return str(self.value)


@dataclass
class SandboxInfo:
    """A sandbox as the API describes it (``Sandbox.get_info``, ``Sandbox.list``)."""

    sandbox_id: str
    template_id: str
    name: Optional[str]
    metadata: Dict[str, str]
    started_at: Optional[_dt.datetime]
    end_at: Optional[_dt.datetime]
    state: SandboxState
    cpu_count: int
    memory_mb: int
    envd_version: Optional[str]
    lifecycle: Optional["SandboxInfoLifecycle"] = None  # get_info only, as E2B's

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxInfo":
        lc = d.get("lifecycle")
        lifecycle: Optional[SandboxInfoLifecycle] = None
        if isinstance(lc, dict):
            lifecycle = {"on_timeout": lc.get("onTimeout", "kill"), "auto_resume": bool(lc.get("autoResume"))}
        return cls(sandbox_id=d["sandboxID"], template_id=d.get("templateID", ""), name=d.get("alias"),
                   metadata=d.get("metadata") or {}, started_at=_time(d.get("startedAt")),
                   end_at=_time(d.get("endAt")), state=SandboxState(d.get("state", "running")),
                   cpu_count=int(d.get("cpuCount", 0)), memory_mb=int(d.get("memoryMB", 0)),
                   envd_version=d.get("envdVersion"), lifecycle=lifecycle)


class SandboxOnTimeoutPause(TypedDict, total=False):
    """``on_timeout`` as an object: ``{"action": "pause", "keep_memory": False}``
    pauses keeping only the files (resume boots afresh; no ``auto_resume``)."""

    action: str
    keep_memory: bool


class SandboxLifecycle(TypedDict, total=False):
    """What happens at the timeout (``Sandbox.create(lifecycle=...)``):
    ``on_timeout`` is ``"kill"`` (the default) or ``"pause"`` (or a
    ``SandboxOnTimeoutPause``); ``auto_resume`` wakes a paused sandbox on
    traffic (only with ``"pause"`` keeping memory)."""

    on_timeout: Union[str, SandboxOnTimeoutPause]
    auto_resume: bool


class SandboxInfoLifecycle(TypedDict):
    """The lifecycle ``get_info`` reports: ``on_timeout`` ``"pause"`` or ``"kill"``, and ``auto_resume``."""

    on_timeout: str
    auto_resume: bool


@dataclass
class SandboxMetrics:
    """One sample of a sandbox's use (``get_metrics``); sizes in bytes."""

    cpu_count: int
    cpu_used_pct: float
    disk_total: int
    disk_used: int
    mem_total: int
    mem_used: int
    mem_cache: int
    timestamp: Optional[_dt.datetime]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SandboxMetrics":
        return cls(cpu_count=int(d.get("cpuCount", 0)), cpu_used_pct=float(d.get("cpuUsedPct", 0.0)),
                   disk_total=int(d.get("diskTotal", 0)), disk_used=int(d.get("diskUsed", 0)),
                   mem_total=int(d.get("memTotal", 0)), mem_used=int(d.get("memUsed", 0)),
                   mem_cache=int(d.get("memCache", 0)), timestamp=_time(d.get("timestamp")))


# E2B's name for the entries of Sandbox.list().
ListedSandbox = SandboxInfo


@dataclass
class SandboxQuery:
    """Filter of ``Sandbox.list``: metadata to match, states (``running``,
    ``paused``), started at or after a time, template ID or name."""

    metadata: Optional[Dict[str, str]] = None
    state: Optional[List[Any]] = None  # SandboxState values or strings
    started_after: Optional[_dt.datetime] = None  # a naive time is local time, as E2B's
    template: Optional[str] = None


@dataclass
class SnapshotInfo:
    """A snapshot. ``snapshot_id`` works as the template of ``Sandbox.create``."""

    snapshot_id: str
    names: List[str] = field(default_factory=list)
    template_id: str = ""
    sandbox_id: str = ""
    size_bytes: int = 0
    created_at: Optional[_dt.datetime] = None
    metadata: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        return cls(snapshot_id=d["snapshotID"], names=d.get("names") or [], template_id=d.get("templateID", ""),
                   sandbox_id=d.get("sandboxID", ""), size_bytes=int(d.get("sizeBytes", 0)),
                   created_at=_time(d.get("createdAt")), metadata=d.get("metadata") or {})


@dataclass
class CommandResult:
    """The outcome of a finished command."""

    stderr: str
    stdout: str
    exit_code: int
    error: Optional[str] = None


class CommandExitException(SandboxException, CommandResult):
    """A command exited with a non-zero code; carries its whole result."""

    def __init__(self, stderr: str, stdout: str, exit_code: int, error: Optional[str] = None):
        SandboxException.__init__(self, f"Command exited with code {exit_code} and error:\n{stderr}")
        CommandResult.__init__(self, stderr=stderr, stdout=stdout, exit_code=exit_code, error=error)

    def __str__(self) -> str:
        return self.message


@dataclass
class ProcessInfo:
    """A process envd started (``commands.list``)."""

    pid: int
    tag: Optional[str]
    cmd: str
    args: List[str]
    envs: Dict[str, str]
    cwd: Optional[str]


class FileType(Enum):
    FILE = "file"
    DIR = "dir"


_FILE_TYPES = {"FILE_TYPE_FILE": FileType.FILE, "FILE_TYPE_DIRECTORY": FileType.DIR}


@dataclass
class EntryInfo:
    """A file or directory in the sandbox."""

    name: str
    type: Optional[FileType]
    path: str
    size: int
    mode: int
    permissions: str
    owner: str
    group: str
    modified_time: Optional[_dt.datetime]
    symlink_target: Optional[str] = None
    # The file's user metadata (user.e2b.* extended attributes); None when it has none.
    metadata: Optional[Dict[str, str]] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "EntryInfo":
        return cls(name=d.get("name", ""), type=_FILE_TYPES.get(d.get("type", "")), path=d.get("path", ""),
                   size=int(d.get("size", 0)), mode=int(d.get("mode", 0)), permissions=d.get("permissions", ""),
                   owner=d.get("owner", ""), group=d.get("group", ""), modified_time=_time(d.get("modifiedTime")),
                   symlink_target=d.get("symlinkTarget"), metadata=d.get("metadata") or None)


@dataclass
class WriteInfo:
    """What ``files.write`` wrote."""

    name: str
    type: Optional[FileType]
    path: str
    metadata: Optional[Dict[str, str]] = None  # what the write stored


@dataclass
class WriteEntry:
    """One file of ``files.write_files``."""

    path: str
    data: Any


class FilesystemEventType(Enum):
    CHMOD = "chmod"
    CREATE = "create"
    REMOVE = "remove"
    RENAME = "rename"
    WRITE = "write"


_EVENT_TYPES = {"EVENT_TYPE_" + t.name: t for t in FilesystemEventType}


@dataclass
class FilesystemEvent:
    """A change in a watched directory; ``name`` is relative to it."""

    name: str
    type: Optional[FilesystemEventType]
    # The entry now at the path, with watch_dir(include_entry=True); None
    # for events whose path no longer names it (remove, rename away).
    entry: Optional[EntryInfo] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FilesystemEvent":
        e = d.get("entry")
        return cls(name=d.get("name", ""), type=_EVENT_TYPES.get(d.get("type", "")),
                   entry=EntryInfo.from_json(e) if isinstance(e, dict) else None)
