"""Where the server is and how to authenticate, from arguments or the environment."""

from __future__ import annotations

import os
import threading
import urllib.parse
from typing import Dict, Optional, Tuple

from . import exceptions as exc
from ._transport import ENVD_PORT, Transport, gone_error, maybe_gone, read_json

DEFAULT_API_URL = "http://127.0.0.1:3000"
DEFAULT_REQUEST_TIMEOUT = 60.0

_transport: Optional[Transport] = None
_transport_lock = threading.Lock()


def shared_transport() -> Transport:
    """The process's one pool of connections (thread-safe)."""
    global _transport
    with _transport_lock:
        if _transport is None:
            _transport = Transport()
        return _transport


DEFAULT_DATA_DIR = "/var/lib/agentenv"


def _key_file() -> Optional[str]:
    """The server's own key (``$AGENTENV_DATA_DIR/api-key``, default
    /var/lib/agentenv), when this user may read it: root on the server's
    host. Other users of a shared server set a named key instead."""
    path = os.path.join(os.environ.get("AGENTENV_DATA_DIR") or DEFAULT_DATA_DIR, "api-key")
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _env(*names: str) -> Optional[str]:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class ConnectionConfig:
    """Connection settings. Arguments win over the environment:

    - API URL: ``api_url``, ``E2B_API_URL``, ``AGENTENV_SERVER``, else http://127.0.0.1:3000
    - sandbox proxy: ``sandbox_url``, ``E2B_SANDBOX_URL``, ``AGENTENV_PROXY``, else the API's
      host on port 3001
    - key: ``api_key``, ``AGENTENV_API_KEY``, ``E2B_API_KEY``, else the server's key file
      (``$AGENTENV_DATA_DIR/api-key``, default /var/lib/agentenv/api-key) when readable
    """

    def __init__(self, api_key: Optional[str] = None, api_url: Optional[str] = None,
                 sandbox_url: Optional[str] = None, request_timeout: Optional[float] = None,
                 domain: Optional[str] = None, debug: Optional[bool] = None):
        self.api_key = api_key or _env("AGENTENV_API_KEY", "E2B_API_KEY") or _key_file()
        self.api_url = (api_url or _env("E2B_API_URL", "AGENTENV_SERVER") or DEFAULT_API_URL).rstrip("/")
        proxy = sandbox_url or _env("E2B_SANDBOX_URL", "AGENTENV_PROXY")
        if not proxy:
            u = urllib.parse.urlsplit(self.api_url)
            proxy = f"{u.scheme}://{u.hostname}:3001"
        self.sandbox_url = proxy.rstrip("/")
        self.request_timeout = request_timeout or DEFAULT_REQUEST_TIMEOUT
        # The domain of sandbox hosts when the server's answer has none
        # (get_host); debug as E2B's: hosts are localhost:<port>.
        self.domain = domain or _env("E2B_DOMAIN")
        self.debug = bool(debug) if debug is not None else (_env("E2B_DEBUG") or "").lower() == "true"
        self.transport = shared_transport()

    def timeout(self, request_timeout: Optional[float]) -> float:
        return request_timeout or self.request_timeout

    def api(self, method: str, path: str, body: Optional[Dict] = None, request_timeout: Optional[float] = None,
            what: str = "") -> object:
        """Calls the REST API and returns the decoded JSON answer (None when empty)."""
        return self.api_page(method, path, body, request_timeout, what)[0]

    def api_page(self, method: str, path: str, body: Optional[Dict] = None,
                 request_timeout: Optional[float] = None, what: str = "") -> Tuple[object, Optional[str]]:
        """Calls the REST API; returns the decoded JSON answer and the
        ``X-Next-Token`` header of a listing page (None on the last page)."""
        if not self.api_key:
            raise exc.AuthenticationException(
                "no API key: pass api_key=, or set AGENTENV_API_KEY or E2B_API_KEY "
                "(agentenv serve prints where its key is stored)")
        import json
        headers = {"X-API-Key": self.api_key, "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body).encode()
        resp = self.transport.request(method, self.api_url + path, headers, data, timeout=self.timeout(request_timeout))
        return read_json(resp, what or f"{method} {path}"), resp.headers.get("X-Next-Token") or None


class EnvdConnection:
    """How a sandbox's envd is reached: the proxy, routing headers and access token."""

    def __init__(self, config: ConnectionConfig, sandbox_id: str, access_token: Optional[str]):
        self.config = config
        self.sandbox_id = sandbox_id
        self.base = config.sandbox_url
        self.headers: Dict[str, str] = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(ENVD_PORT)}
        if access_token:
            self.headers["X-Access-Token"] = access_token

    @property
    def transport(self) -> Transport:
        return self.config.transport

    def explain(self, err: BaseException) -> BaseException:
        """A more precise error than ``err`` when the sandbox is gone: after a
        broken stream or the proxy's 502, the API says whether it ran out of
        memory, was lost (and why), timed out (when) or was killed. ``err``
        itself when the sandbox still runs or the API cannot say."""
        if not maybe_gone(err):
            return err
        what = str(err).split(":", 1)[0]
        try:
            self.config.api("GET", "/sandboxes/" + urllib.parse.quote(self.sandbox_id, safe=""),
                            request_timeout=min(self.config.request_timeout, 10.0),
                            what=f"sandbox {self.sandbox_id}")
        except exc.NotFoundException as nf:
            better = gone_error(nf, self.sandbox_id, what)
            better.__cause__ = err
            return better
        except Exception:  # the API is unreachable too: keep what we know
            return err
        return err
