"""The transport against a fake envd on loopback: what a hostile or broken
peer sends is bounded before the SDK allocates it."""

import json
import socket
import struct
import threading
import tracemalloc
import unittest

from agentenv import SandboxException
from agentenv._transport import MAX_MESSAGE_BYTES, Transport, connect_stream, connect_unary


class _FakeEnvd:
    """Answers each connection once with ``reply`` (raw HTTP/1.1 bytes)
    and records whether the client hung up."""

    def __init__(self, reply: bytes):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.base = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.hung_up = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(self.reply)
            # Keep the stream open, as a peer that claims more would: only
            # the client closing it ends this.
            conn.settimeout(30)
            try:
                while conn.recv(65536):
                    pass
            except OSError:
                pass
            self.hung_up.set()

    def close(self):
        self.sock.close()


def _envelope(flags: int, n: int, payload: bytes = b"") -> bytes:
    return struct.pack(">BI", flags, n) + payload


def _chunk(b: bytes) -> bytes:
    return b"%x\r\n" % len(b) + b + b"\r\n"


class MessageBoundTests(unittest.TestCase):
    def setUp(self):
        self.transport = Transport()
        self.addCleanup(self.transport.close)

    def test_huge_envelope_raises_and_closes(self):
        # One event, then an envelope that claims 4 GiB and sends 10 bytes,
        # in a body that claims 1 TB.
        ok = json.dumps({"event": {"start": {"pid": 7}}}).encode()
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nContent-Length: 1000000000000\r\n\r\n"
                 + _envelope(0, len(ok), ok) + _envelope(0, 0xFFFFFFFF, b"x" * 10))
        fake = _FakeEnvd(reply)
        self.addCleanup(fake.close)
        stream = connect_stream(self.transport, fake.base, {}, "process.Process/Start", {}, None, 30)
        got = []
        tracemalloc.start()
        try:
            with self.assertRaises(SandboxException) as cm:
                for msg in stream:
                    got.append(msg)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertEqual(got, [{"event": {"start": {"pid": 7}}}])
        self.assertIn("4294967295 bytes", str(cm.exception))
        self.assertIn("limit", str(cm.exception))
        self.assertLess(peak, 16 << 20, "the claimed length was allocated")
        self.assertTrue(stream.closed)
        self.assertTrue(fake.hung_up.wait(10), "the stream's connection was kept open")

    def test_envelope_under_the_limit_is_read_in_pieces(self):
        # A length under the limit that the peer never sends in full: the
        # SDK waits for bytes, it does not allocate the length up front.
        t = Transport(max_message_bytes=48 << 20)
        self.addCleanup(t.close)
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + _chunk(_envelope(0, 40 << 20, b"{" * 100)) + b"0\r\n\r\n")
        fake = _FakeEnvd(reply)
        self.addCleanup(fake.close)
        stream = connect_stream(t, fake.base, {}, "process.Process/Start", {}, None, 30)
        tracemalloc.start()
        try:
            with self.assertRaises(SandboxException):
                list(stream)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertLess(peak, 16 << 20, "a message's claimed length was allocated before its bytes came")

    def test_limit_is_an_option(self):
        self.assertEqual(Transport().max_message_bytes, MAX_MESSAGE_BYTES)
        t = Transport(max_message_bytes=1000)
        self.addCleanup(t.close)
        big = json.dumps({"event": {"data": {"stdout": "x" * 2000}}}).encode()
        reply = (b"HTTP/1.1 200 OK\r\nContent-Type: application/connect+json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + _chunk(_envelope(0, len(big), big)) + b"0\r\n\r\n")
        fake = _FakeEnvd(reply)
        self.addCleanup(fake.close)
        with self.assertRaises(SandboxException):
            list(connect_stream(t, fake.base, {}, "process.Process/Start", {}, None, 30))

    def test_unary_answer_is_bounded(self):
        t = Transport(max_message_bytes=1 << 20)
        self.addCleanup(t.close)
        # Claims 1 TB, sends 2 MiB and keeps the connection open.
        reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n" + b" " * (2 << 20)
        fake = _FakeEnvd(reply)
        self.addCleanup(fake.close)
        with self.assertRaises(SandboxException) as cm:
            connect_unary(t, fake.base, {}, "filesystem.Filesystem/Stat", {}, 30)
        self.assertIn("larger than 1048576 bytes", str(cm.exception))
        self.assertTrue(fake.hung_up.wait(10), "the connection was kept open")


if __name__ == "__main__":
    unittest.main()
