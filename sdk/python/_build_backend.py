"""A PEP 517 build backend in the standard library, so that
``pip install ./sdk/python`` works with no index at all: a plain Python
3.11 venv has setuptools 65 without ``wheel``, which cannot build a wheel
offline. It packs ``agentenv/`` into a pure-Python wheel or an sdist.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

NAME = "agentenv"
HERE = os.path.dirname(os.path.abspath(__file__))


def _version():
    with open(os.path.join(HERE, NAME, "__init__.py"), encoding="utf-8") as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def _metadata():
    with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Python SDK of agentenv: gVisor sandboxes and RL environments, with E2B's Python SDK API\n"
            "License: Apache-2.0\nRequires-Python: >=3.9\nClassifier: Typing :: Typed\n"
            f"Description-Content-Type: text/markdown\n\n{readme}")


def _package_files():
    for root, dirs, files in os.walk(os.path.join(HERE, NAME)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith((".py", ".typed")):
                full = os.path.join(root, f)
                yield full, os.path.relpath(full, HERE).replace(os.sep, "/")


def _record_line(arc, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arc},sha256={digest},{len(data)}"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    dist_info = f"{NAME}-{_version()}.dist-info"
    filename = f"{NAME}-{_version()}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data):
            z.writestr(arc, data)
            record.append(_record_line(arc, data))

        for full, arc in _package_files():
            with open(full, "rb") as f:
                add(arc, f.read())
        add(f"{dist_info}/METADATA", _metadata().encode())
        add(f"{dist_info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: agentenv _build_backend\n"
                                  b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        add(f"{dist_info}/top_level.txt", f"{NAME}\n".encode())
        record.append(f"{dist_info}/RECORD,,")
        z.writestr(f"{dist_info}/RECORD", "\n".join(record) + "\n")
    return filename


def build_sdist(sdist_directory, config_settings=None):
    base = f"{NAME}-{_version()}"
    filename = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz") as t:
        for name in ("pyproject.toml", "README.md", "_build_backend.py"):
            t.add(os.path.join(HERE, name), f"{base}/{name}")
        for full, arc in _package_files():
            t.add(full, f"{base}/{arc}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    return filename
