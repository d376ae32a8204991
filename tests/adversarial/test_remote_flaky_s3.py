"""Red team 16, faults: the S3 server throttles (503 SlowDown), fails (500), and drops
connections mid-push, including after it stored a PUT (the client never hears it succeeded).
A flaky proxy on 127.0.0.1 in front of the real `rclone serve s3` does it. What must hold:
the push succeeds or fails with one `envgit:` line (no traceback); a later push without
faults is complete (the bucket's log is the local log) and `fsck --remote` is clean."""

import http.client
import http.server
import json
import random
import threading

import pytest

from test_remote import add_remote, fill, machine


class Flaky(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _any(self):
        n = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(n) if n else b""
        s = self.server
        with s.lock:
            roll = s.rng.random() if s.faulty else 1.0
            s.requests += 1
        if roll < 0.15:
            s.faults.append("503")
            msg = b"<Error><Code>SlowDown</Code><Message>slow down</Message></Error>"
            self.send_response(503)
            self.send_header("content-type", "application/xml")
            self.send_header("content-length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        if roll < 0.22:
            s.faults.append("drop-before")
            self.close_connection = True
            self.connection.shutdown(2)
            return
        c = http.client.HTTPConnection("127.0.0.1", s.backend, timeout=60)
        headers = {k: v for k, v in self.headers.items()}
        c.request(self.command, self.path, body=body, headers=headers)
        r = c.getresponse()
        data = r.read()
        if roll < 0.30 and self.command == "PUT":
            s.faults.append("drop-after-put")          # stored, but the client never hears it
            self.close_connection = True
            self.connection.shutdown(2)
            c.close()
            return
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        c.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    def log_message(self, *a):
        pass


@pytest.fixture
def flaky(s3):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    srv.backend, srv.rng, srv.lock = s3.port, random.Random(1616), threading.Lock()
    srv.faulty, srv.faults, srv.requests = True, [], 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_a_push_through_throttling_and_dropped_connections_is_complete_or_resumed(tmp_path, s3, flaky):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    for i in range(6):
        m1.run(f"echo {i} > f{i}.txt; head -c 200000 /dev/urandom > r{i}.bin", check=True)
    add_remote(m1, s3)                                   # added straight, then pointed at the proxy
    m1.envgit("remote", "set", "ci", "--endpoint", f"http://127.0.0.1:{flaky.server_address[1]}", check=True)
    outcomes = []
    for _ in range(3):
        r = m1.envgit("push", "ci", timeout=600)
        outcomes.append(r.returncode)
        assert "Traceback" not in r.stderr, r.stderr
        if r.returncode:
            assert r.stderr.startswith("envgit: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
        m1.run("echo more >> more.txt", check=True)
    assert flaky.faults, "the proxy injected nothing"
    flaky.faulty = False
    m1.envgit("push", "ci", check=True, timeout=600)
    r = m1.envgit("fsck", "--remote", "ci", "--json", timeout=600)
    got = json.loads(r.stdout)
    assert r.returncode == 0 and got["ok"], (got["problems"], outcomes, flaky.faults)
    mine = json.loads(m1.envgit("log", "--json", check=True).stdout)
    theirs = json.loads(m1.envgit("log", "--remote", "ci", "--json", check=True).stdout)
    assert theirs["problems"] == [] and theirs["steps"] == mine, (outcomes, len(flaky.faults))
