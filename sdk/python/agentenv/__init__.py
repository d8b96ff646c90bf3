"""agentenv: gVisor sandboxes for training and evaluating agents.

The API is E2B's Python SDK's (``from e2b import Sandbox`` becomes
``from agentenv import Sandbox``), plus ``Sandbox.fork`` and the RL
environments in ``agentenv.rl``. Standard library only.

    from agentenv import Sandbox

    with Sandbox.create("busybox") as sbx:
        print(sbx.commands.run("echo hello").stdout)
"""

from .aio import AsyncCommandHandle, AsyncPaginator, AsyncPty, AsyncSandbox, AsyncWatchHandle
from .commands import CommandHandle, Commands
from .config import ConnectionConfig
from .exceptions import (AuthenticationException, ConflictException, FileNotFoundException, InvalidArgumentException,
                         NotEnoughSpaceException, NotFoundException, OutOfMemoryException, RateLimitException,
                         SandboxException, SandboxLostException, SandboxNotFoundException, TemplateException,
                         TimeoutException)
from .filesystem import Filesystem, WatchHandle
from .models import (CommandExitException, CommandResult, EntryInfo, FilesystemEvent, FilesystemEventType,
                     FileType, ListedSandbox, ProcessInfo, SandboxInfo, SandboxInfoLifecycle, SandboxLifecycle,
                     SandboxMetrics, SandboxOnTimeoutPause, SandboxQuery, SandboxState, SnapshotInfo, WriteEntry,
                     WriteInfo)
from .pty import Pty, PtySize
from .sandbox import Paginator, Sandbox, SandboxPaginator, SnapshotPaginator

__version__ = "0.1.0"

__all__ = [
    "AsyncCommandHandle", "AsyncPaginator", "AsyncPty", "AsyncSandbox", "AsyncWatchHandle", "AuthenticationException", "CommandExitException",
    "CommandHandle", "CommandResult", "Commands", "ConflictException", "ConnectionConfig", "EntryInfo", "FileNotFoundException", "FileType",
    "Filesystem", "FilesystemEvent", "FilesystemEventType", "InvalidArgumentException", "ListedSandbox",
    "NotEnoughSpaceException", "NotFoundException", "OutOfMemoryException", "Paginator", "ProcessInfo", "Pty", "PtySize", "RateLimitException", "Sandbox",
    "SandboxException", "SandboxInfo", "SandboxInfoLifecycle", "SandboxLifecycle", "SandboxMetrics",
    "SandboxLostException", "SandboxOnTimeoutPause", "SandboxNotFoundException", "SandboxPaginator", "SandboxQuery",
    "SandboxState", "SnapshotInfo", "SnapshotPaginator", "TemplateException", "TimeoutException", "WatchHandle", "WriteEntry", "WriteInfo",
]
