"""E2B's URLs: get_host (https://<port>-<id>.<domain>, the server's local CA
trusted through SSL_CERT_FILE), download_url and upload_url (signed, on the
sandbox proxy), and auto-resume by an HTTPS request. Needs a server started
with --domain under .localhost and nss-myhostname (make setup);
internal/server/python_test.go sets SSL_CERT_FILE and
AGENTENV_REQUIRE_HOSTS=1, which turns a missing piece into a failure."""

import json
import os
import socket
import time
import unittest
import urllib.error
import urllib.request
import uuid

from agentenv import ConnectionConfig, InvalidArgumentException, Sandbox

from .support import SandboxTest


def _missing() -> str:
    if not os.environ.get("SSL_CERT_FILE"):
        return "SSL_CERT_FILE is not set to the server's ca.pem"
    try:
        socket.getaddrinfo("8000-probe.agentenv.localhost", 443)
    except OSError as e:
        return f"*.agentenv.localhost does not resolve ({e}): install libnss-myhostname (make setup)"
    return ""


def _get(url: str, timeout: float = 10):
    """GET url; returns (status, body bytes), HTTP errors included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _upload(url: str, data: bytes):
    """POSTs data as E2B's upload URL wants it: multipart/form-data, field "file"."""
    b = uuid.uuid4().hex
    body = (f"--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + f"\r\n--{b}--\r\n".encode()
    req = urllib.request.Request(url, data=body, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={b}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class HostTests(SandboxTest):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        why = _missing()
        if why and os.environ.get("AGENTENV_REQUIRE_HOSTS") == "1":
            raise AssertionError(why)
        if why:
            raise unittest.SkipTest(why)

    def serve(self, sbx: Sandbox, port: int, body: str) -> str:
        sbx.files.write(f"/tmp/www{port}/index.html", body)
        sbx.commands.run(f"httpd -p {port} -h /tmp/www{port}")
        url = f"https://{sbx.get_host(port)}/index.html"
        deadline = time.monotonic() + 10
        while True:
            try:
                status, got = _get(url)
                if status == 200:
                    return url
            except OSError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                self.fail(f"{url} answered {status}")
            time.sleep(0.1)

    def test_get_host_over_https(self):
        sbx = self.new_sandbox()
        self.assertRegex(sbx.sandbox_domain or "", r"^agentenv\.localhost:\d+$")
        self.assertEqual(sbx.get_host(8000), f"8000-{sbx.sandbox_id}.{sbx.sandbox_domain}")
        url = self.serve(sbx, 8000, "hello over https\n")
        self.assertEqual(_get(url), (200, b"hello over https\n"))
        status, body = _get(f"https://{sbx.get_host(8001)}/")
        self.assertEqual(status, 502)
        self.assertEqual(json.loads(body)["message"], "The sandbox is running but port is not open")

    def test_signed_urls_round_trip(self):
        sbx = self.new_sandbox()
        other = self.new_sandbox()  # the proxy must tell them apart by the signature
        other.files.write("/tmp/signed.bin", b"not this one")
        data = os.urandom(4096)
        up = sbx.upload_url("/tmp/signed.bin", use_signature_expiration=60)
        self.assertNotIn(sbx.sandbox_id, up, "the URL names no sandbox, as E2B's with E2B_SANDBOX_URL")
        self.assertEqual(_upload(up, data)[0], 200)
        self.assertEqual(_get(sbx.download_url("/tmp/signed.bin", use_signature_expiration=60)), (200, data))
        self.assertEqual(_get(sbx.download_url("/tmp/signed.bin")), (200, data))
        self.assertEqual(_get(other.download_url("/tmp/signed.bin", user="root")), (200, b"not this one"))
        status, body = _get(sbx.download_url("/tmp/signed.bin", use_signature_expiration=-10))
        self.assertEqual(status, 401)
        self.assertEqual(json.loads(body)["message"], "signature is already expired")
        status, body = _upload(sbx.upload_url("/tmp/signed.bin", use_signature_expiration=-10), b"x")
        self.assertEqual(status, 401)
        self.assertEqual(json.loads(body)["message"], "signature is already expired")
        self.assertEqual(sbx.files.read("/tmp/signed.bin", format="bytes"), data)

    def test_https_request_resumes_a_paused_sandbox(self):
        sbx = self.new_sandbox(lifecycle={"on_timeout": "pause", "auto_resume": True})
        url = self.serve(sbx, 8080, "resumed\n")
        sbx.pause()
        self.assertEqual(Sandbox.get_info(sbx.sandbox_id).state, "paused")
        self.assertEqual(_get(url), (200, b"resumed\n"))
        self.assertEqual(Sandbox.get_info(sbx.sandbox_id).state, "running")


class HostURLOfflineTests(unittest.TestCase):
    """URL building without a server."""

    def sandbox(self, token="tok", domain="agentenv.localhost:3443"):
        cfg = ConnectionConfig(api_url="http://127.0.0.1:3000", sandbox_url="http://127.0.0.1:3001", api_key="k")
        return Sandbox("i0123", token, cfg, domain)

    def test_get_host(self):
        self.assertEqual(self.sandbox().get_host(8000), "8000-i0123.agentenv.localhost:3443")

    def test_signature_is_e2bs(self):
        # The value E2B's JS SDK computes for these inputs (getSignature).
        self.assertEqual(self.sandbox().upload_url("/tmp/x"),
                         "http://127.0.0.1:3001/files?path=%2Ftmp%2Fx&signature=v1_jA0oZH2G6edU%2FzsgL1irD3Bf0L%2BJ0WRcE26Zm9itpDA")

    def test_expiration_needs_a_token(self):
        with self.assertRaises(InvalidArgumentException):
            self.sandbox(token=None).download_url("/tmp/x", use_signature_expiration=10)
        self.assertEqual(self.sandbox(token=None).download_url("/tmp/x", user="root"),
                         "http://127.0.0.1:3001/files?path=%2Ftmp%2Fx&username=root")
