"""Builds the examples' fallback ``python`` template: busybox plus this
host's Debian python3 (interpreter, its few shared libraries and the
standard library).

The examples run a real ``python3 -m unittest`` inside each sandbox, in the
template ``base`` by default: the Debian template with python3 that ``make
demo`` builds (``agentenv template build base --debian bookworm --packages
python3,git,curl,ca-certificates,procps``, minutes of debootstrap). On a
server without it (``make test``'s), they build this one instead, in
seconds. Pass ``--template`` to the examples to use any template with python3.

    python3 python_template.py [--name python] [--force]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import threading
from typing import Iterator, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sdk", "python"))

from agentenv import ConnectionConfig, NotFoundException, SandboxException  # noqa: E402

PYTHON = "/usr/bin/python3.11"
STDLIB = "/usr/lib/python3.11"
# Big parts of the standard library no test suite of ours needs.
SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "dist-packages",
        "config-3.11-x86_64-linux-gnu", "pydoc_data"}


def _libs(binary: str) -> list:
    """The shared libraries ``binary`` loads (ldd), the loader included."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


def _add_file(tar: tarfile.TarFile, src: str, dst: str) -> None:
    info = tar.gettarinfo(os.path.realpath(src), arcname=dst)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with open(os.path.realpath(src), "rb") as f:
        tar.addfile(info, f)


def _add_link(tar: tarfile.TarFile, dst: str, target: str) -> None:
    info = tarfile.TarInfo(dst)
    info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
    tar.addfile(info)


def _add_dir(tar: tarfile.TarFile, dst: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(dst)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def write_rootfs(out) -> None:
    """Writes the template's root filesystem as a tar stream to ``out``."""
    if not os.path.exists(PYTHON):
        raise SystemExit(f"{PYTHON} is missing: install the Debian package python3 (scripts/setup.sh does)")
    tar = tarfile.open(fileobj=out, mode="w|")
    try:
        _add_all(tar)
    finally:
        # End with the two zero blocks alone, not padded to tarfile's 10 KiB
        # record: the server stops reading at the end marker, and an unread
        # tail of a full-duplex upload makes Go's HTTP server panic
        # ("invalid concurrent Body.Read call").
        tar.fileobj.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))
        tar.fileobj.close()
        tar.closed = True


def _add_all(tar: tarfile.TarFile) -> None:
    for d in ("bin", "usr", "usr/bin", "usr/lib", "lib", "lib64", "etc", "tmp", "home", "home/user", "root"):
        _add_dir(tar, d, 0o1777 if d == "tmp" else 0o755)
    _add_file(tar, "/bin/busybox", "bin/busybox")
    applets = subprocess.run(["/bin/busybox", "--list"], check=True, capture_output=True, text=True).stdout.split()
    for a in applets:
        if a not in ("busybox", "bash"):
            _add_link(tar, "bin/" + a, "busybox")
    _add_file(tar, PYTHON, "usr/bin/python3.11")
    _add_link(tar, "usr/bin/python3", "python3.11")
    _add_link(tar, "usr/bin/python", "python3.11")
    _add_dir(tar, "lib/x86_64-linux-gnu")
    for lib in _libs(PYTHON):
        dst = lib.lstrip("/")
        if dst.startswith("lib64/"):
            _add_file(tar, lib, dst)
        else:
            _add_file(tar, lib, "lib/x86_64-linux-gnu/" + os.path.basename(lib))
    for root, dirs, files in os.walk(STDLIB):
        dirs[:] = sorted(d for d in dirs if d not in SKIP)
        rel = os.path.relpath(root, "/")
        _add_dir(tar, rel)
        for f in sorted(files):
            if ".opt-" in f:
                continue  # optimized bytecode: unused
            _add_file(tar, os.path.join(root, f), os.path.join(rel, f))


def _stream() -> Iterator[bytes]:
    """The tar stream, produced by a thread while it is uploaded."""
    r, w = os.pipe()

    def produce() -> None:
        with os.fdopen(w, "wb") as f:
            write_rootfs(f)

    t = threading.Thread(target=produce, daemon=True)
    t.start()
    with os.fdopen(r, "rb") as f:
        while True:
            chunk = f.read(1 << 16)
            if not chunk:
                break
            yield chunk
    t.join()


def exists(config: ConnectionConfig, name: str) -> bool:
    try:
        config.api("GET", "/templates/" + name)
    except NotFoundException:
        return False
    return True


def ensure(name: str = "python", force: bool = False, quiet: bool = False, **opts) -> str:
    """Builds the template unless it exists; returns its name."""
    config = ConnectionConfig(**opts)
    if not force and exists(config, name):
        return name
    headers = {"X-API-Key": config.api_key or "", "Content-Type": "application/x-tar"}
    resp = config.transport.request("POST", f"{config.api_url}/agentenv/templates/{name}/rootfs", headers,
                                    _stream(), timeout=600)
    if resp.status >= 300:
        raise SandboxException(f"template build {name}: HTTP {resp.status}: {resp.read().decode()}")
    buf = b""
    for chunk in resp.iter_chunks():
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            ev = json.loads(line)
            if ev.get("progress") and not quiet:
                p = ev["progress"]
                print(f"  {p.get('percent', 0):5.1f}% {p.get('phase', '')}: {p.get('message', '')}", file=sys.stderr)
            elif ev.get("error"):
                raise SandboxException(f"template build {name}: {ev['error'].get('message')}")
            elif ev.get("template"):
                return name
    raise SandboxException(f"template build {name}: the build stream ended without a result")


def pick(template: Optional[str] = None) -> str:
    """The template an example runs in: the one named, else ``base``, else
    ``python`` built here (said on stderr)."""
    if template and template != "python":
        return template
    if not template and exists(ConnectionConfig(), "base"):
        return "base"
    if not template:
        print("examples: this server has no template 'base' (make demo builds it); using 'python', "
              "busybox plus this host's python3 (examples/python_template.py)", file=sys.stderr)
    return ensure(quiet=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="python")
    ap.add_argument("--force", action="store_true", help="rebuild even if it exists")
    ap.add_argument("--tar", help="only write the rootfs tarball to this file")
    a = ap.parse_args()
    if a.tar:
        with open(a.tar, "wb") as f:
            write_rootfs(f)
        return
    print("template", ensure(a.name, a.force))


if __name__ == "__main__":
    main()

