"""The gate end to end: real git and curl through the real embedded mitmproxy to a real git
http-backend over TLS, all on 127.0.0.1. (The sandbox side, bwrap and the in-sandbox bridge,
is tested with the sandbox; here clients reach the gate's TCP port or its unix socket.)"""

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from conftest import network_policy
from gitserver import GitServer

REJECTED = "! [remote rejected] main -> main (envgit: git push is irreversible; rule preset:default/git-push)"


def policy(allow, irreversible=({"preset": "default"},), l7=None):
    return network_policy(allow, irreversible, l7)


class GateRunner:
    """A Gate in an event loop of its own thread (the daemon's loop, in miniature)."""

    def __init__(self, pol, resolve, upstream_ca, answer=None, ask_timeout=5.0, root=None):
        from envgit.proxy import Gate
        self.policy, self.answer, self.records, self.questions = pol, answer, [], []
        self.root = Path(root or tempfile.mkdtemp(prefix="envgit-gate-"))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gate = Gate(lambda: self.policy, self.root / "state", resolve,
                         lambda step, rec: self.records.append((step, rec)), self._ask,
                         upstream_ca=upstream_ca, ask_timeout=ask_timeout)
        self.call(self.gate.start(tcp_port=0))
        # Clients trust the session CA (intercepted hosts) and the test CA (tunnelled ones).
        self.cafile = self.root / "clients-ca.pem"
        self.cafile.write_bytes(self.gate.ca_cert_path.read_bytes() + Path(upstream_ca).read_bytes())

    async def _ask(self, step, question):
        self.questions.append((step, question))
        if self.answer is None:
            await asyncio.sleep(3600)
        return self.answer

    def call(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def step(self, step_id):
        return self.gate.open_step(step_id)

    def proxy_url(self, cred):
        host, port = self.gate.tcp_address
        return f"http://{cred}@{host}:{port}"

    def env(self, cred):
        proxy = self.proxy_url(cred)
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        env.update(HTTPS_PROXY=proxy, HTTP_PROXY=proxy, https_proxy=proxy, http_proxy=proxy,
                   GIT_SSL_CAINFO=str(self.cafile), CURL_CA_BUNDLE=str(self.cafile),
                   SSL_CERT_FILE=str(self.cafile), npm_config_cafile=str(self.cafile),
                   GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0", HOME=str(self.root))
        return env

    def recs(self, step=None, settle=0.3):
        # A record is written when mitmproxy has finished the flow, which may be a moment
        # after the client has its answer (a tunnel's once the client has gone): wait until
        # the gate holds no client connection (it lets one go only after its records are
        # written; `settle` alone was a guess a loaded machine could beat), then until no new
        # record arrived for `settle` s.
        deadline = time.monotonic() + 15
        while self.gate._conns and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline, n = time.monotonic() + 5, -1
        while n != len(self.records) and time.monotonic() < deadline:
            n = len(self.records)
            time.sleep(settle)
        return [r for s, r in self.records if step is None or s == step]

    def stop(self):
        self.call(self.gate.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def git_server():
    with GitServer() as srv:
        yield srv


@pytest.fixture
def gate_for(git_server):
    runners = []

    def make(irreversible=({"preset": "default"},), answer=None, ask_timeout=5.0, allow=()):
        pol = policy([f"git.example.test:{git_server.port}", *allow], irreversible)
        r = GateRunner(pol, {"git.example.test": "127.0.0.1"}, git_server.ca.cert_path, answer,
                       ask_timeout)
        runners.append(r)
        return r
    yield make
    for r in runners:
        r.stop()


def run(args, env, cwd=None, timeout=60, **kw):
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, **kw)


def clone(gate, srv, cred, big=False):
    env = gate.env(cred)
    work = gate.root / f"clone-{time.monotonic_ns()}"
    r = run(["git", "clone", "-q", srv.url, str(work)], env)
    assert r.returncode == 0, r.stderr
    if big:      # past http.postBuffer: git sends the 4-byte probe, then a chunked POST
        (work / "blob").write_bytes(os.urandom(3 << 20))
    else:
        (work / "change").write_text("change\n")
    run(["git", "add", "-A"], env, cwd=work)
    r = run(["git", "-c", "user.name=a", "-c", "user.email=a@example.test", "commit", "-qm", "c"], env, cwd=work)
    assert r.returncode == 0, r.stderr
    return work, env


# --- fetch and push --------------------------------------------------------------------------

def test_clone_and_fetch_go_through(gate_for, git_server):
    gate = gate_for()
    cred = gate.step(1)
    work, env = clone(gate, git_server, cred)
    r = run(["git", "fetch", "origin"], env, cwd=work)
    assert r.returncode == 0, r.stderr
    recs = gate.recs(1)
    assert recs and all(r["decision"] == "allow" for r in recs)
    assert {r["path"] for r in recs} >= {"/repo.git/info/refs?service=git-upload-pack",
                                         "/repo.git/git-upload-pack"}
    assert all(r["status"] == 200 and r["bytes_down"] > 0 for r in recs)


@pytest.mark.parametrize("how", ["git push", "g=git; $g push", "git -c push.default=current push",
                                 "big push", "script"])
def test_push_denied_and_remote_unchanged(gate_for, git_server, how):
    gate = gate_for()
    cred = gate.step(1)
    work, env = clone(gate, git_server, cred, big=how == "big push")
    before = git_server.refs()
    script = {"git push": "git push origin main", "g=git; $g push": "g=git; $g push origin main",
              "git -c push.default=current push": "git -c push.default=current push origin",
              "big push": "git push origin main",
              "script": "printf '#!/bin/sh\\nexec git push origin main\\n' > p.sh; sh p.sh"}[how]
    r = run(["sh", "-c", script], env, cwd=work)
    assert r.returncode != 0
    assert REJECTED in r.stderr, r.stderr
    assert "Everything up-to-date" not in r.stderr
    assert git_server.refs() == before
    assert not [p for m, p, s in git_server.log if p.endswith("git-receive-pack") and m == "POST"
                and s == 200 and how != "big push"]
    recs = gate.recs(1)
    advert = [r for r in recs if r["path"] == "/repo.git/info/refs?service=git-receive-pack"]
    assert advert and advert[0]["decision"] == "allow"
    denied = [r for r in recs if r["decision"] == "deny"]
    assert len(denied) == 1 and denied[0]["rule"] == "preset:default/git-push"
    assert denied[0]["kind"] == "git push" and denied[0]["irreversible"] is False


def test_raw_curl_receive_pack_denied(gate_for, git_server):
    gate = gate_for()
    cred = gate.step(1)
    before = git_server.refs()
    old = before["refs/heads/main"]
    line = f"{old} {'1' * 40} refs/heads/main\0report-status side-band-64k".encode()
    body = b"%04x" % (len(line) + 4) + line + b"0000PACK..."
    r = run(["curl", "-sS", "-X", "POST", "--data-binary", "@-", "-H",
             "Content-Type: application/x-git-receive-pack-request",
             git_server.url + "/git-receive-pack"], gate.env(cred), input=body.decode("latin-1"))
    assert "ng refs/heads/main envgit: git push is irreversible" in r.stdout
    assert git_server.refs() == before
    assert not any(p.endswith("git-receive-pack") for _, p, _ in git_server.log)
    r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-d", "junk",
             git_server.url + "/git-receive-pack"], gate.env(cred))
    assert r.stdout == "403"


def test_push_allowed_lands_and_is_marked(gate_for, git_server):
    gate = gate_for(irreversible=[{"preset": "default"}, {"rule": "git-push", "action": "allow"}])
    cred = gate.step(7)
    work, env = clone(gate, git_server, cred)
    head = run(["git", "rev-parse", "HEAD"], env, cwd=work).stdout.strip()
    r = run(["git", "push", "origin", "main"], env, cwd=work)
    assert r.returncode == 0, r.stderr
    assert git_server.refs()["refs/heads/main"] == head
    push = [r for r in gate.recs(7) if r["method"] == "POST" and r["path"].endswith("git-receive-pack")]
    assert len(push) == 1 and push[0]["irreversible"] is True and push[0]["status"] == 200
    assert push[0]["rule"] == "preset:default/git-push" and push[0]["bytes_up"] > 0


@pytest.mark.parametrize("answer", ["allow", "deny"])
def test_push_ask_is_asked_once_with_the_refs(gate_for, git_server, answer):
    gate = gate_for(irreversible=[{"preset": "default"}, {"rule": "git-push", "action": "ask"}],
                    answer=(answer, "tester", "terminal"))
    cred = gate.step(3)
    work, env = clone(gate, git_server, cred, big=True)
    head = run(["git", "rev-parse", "HEAD"], env, cwd=work).stdout.strip()
    before = git_server.refs()
    r = run(["git", "push", "origin", "main"], env, cwd=work)
    assert len(gate.questions) == 1                 # not again for the 4-byte probe
    step, q = gate.questions[0]
    assert step == 3 and q["kind"] == "git push" and q["rule"] == "preset:default/git-push"
    assert q["refs"] == [{"ref": "refs/heads/main", "old": before["refs/heads/main"], "new": head,
                          "action": "update"}]
    rec = [r for r in gate.recs(3) if r["decision"] == "ask"][0]
    assert (rec["answer"], rec["answered_by"], rec["answered_how"]) == (answer, "tester", "terminal")
    assert rec["answered_at"] > 0
    if answer == "allow":
        assert r.returncode == 0, r.stderr
        assert git_server.refs()["refs/heads/main"] == head and rec["irreversible"] is True
    else:
        assert "[remote rejected] main -> main" in r.stderr and git_server.refs() == before
        assert rec["irreversible"] is False


def test_push_ask_times_out_to_deny(gate_for, git_server):
    gate = gate_for(irreversible=[{"preset": "default", "action": "ask"}], ask_timeout=1.0)
    cred = gate.step(4)
    work, env = clone(gate, git_server, cred)
    before = git_server.refs()
    t = time.monotonic()
    r = run(["git", "push", "origin", "main"], env, cwd=work)
    assert time.monotonic() - t < 20
    assert "[remote rejected] main -> main" in r.stderr and "no answer within 1 s" in r.stderr
    assert git_server.refs() == before
    rec = [r for r in gate.recs(4) if r["decision"] == "ask"][0]
    assert rec["answer"] == "deny" and rec["answered_by"] == "timeout"


# --- credentials and attribution -------------------------------------------------------------

def test_requests_need_the_steps_credentials(gate_for, git_server):
    gate = gate_for()
    cred = gate.step(1)
    url = git_server.url + "/info/refs?service=git-upload-pack"
    for bad in ["", "step1:wrong", "step2:" + cred.split(":")[1]]:
        env = gate.env(cred)
        host, port = gate.gate.tcp_address
        env["HTTPS_PROXY"] = env["https_proxy"] = f"http://{bad + '@' if bad else ''}{host}:{port}"
        r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], env)
        assert r.stdout.strip() == "407" or "407" in r.stderr, (bad, r.stdout, r.stderr)
    r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], gate.env(cred))
    assert r.stdout == "200"
    gate.gate.close_step(1)
    r = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url], gate.env(cred))
    assert r.stdout.strip() != "200"
    assert all(s == 1 for s, _ in gate.records)


def test_query_values_are_redacted(gate_for, git_server):
    gate = gate_for()
    cred = gate.step(1)
    run(["curl", "-sS", git_server.url + "/info/refs?service=git-upload-pack&token=s3cret"], gate.env(cred))
    (rec,) = gate.recs(1)
    assert rec["path"] == "/repo.git/info/refs?service=git-upload-pack&token=REDACTED"


def test_unix_socket_through_a_socat_bridge(gate_for, git_server):
    gate = gate_for()
    cred = gate.step(1)
    # on the unix socket a credential works only once tied to its sandbox's pid namespace:
    # here the bridge runs in the test's own
    gate.gate.bind_step(1, os.stat("/proc/self/ns/pid").st_ino)
    sock = gate.gate.socket_path
    assert (sock.stat().st_mode & 0o777) == 0o600
    bridge = subprocess.Popen(["socat", "TCP-LISTEN:0,bind=127.0.0.1,reuseaddr,fork,nodelay",
                               f"UNIX-CONNECT:{sock}"], stderr=subprocess.PIPE)
    try:
        port = None
        for _ in range(300):
            out = run(["ss", "-Hltnp"], os.environ).stdout
            port = next((ln.split()[3].rsplit(":", 1)[1] for ln in out.splitlines()
                         if f"pid={bridge.pid}," in ln), None)
            if port:
                break
            time.sleep(0.1)
        assert port, "socat did not listen"
        env = gate.env(cred)
        env["HTTPS_PROXY"] = env["https_proxy"] = f"http://{cred}@127.0.0.1:{port}"
        r = run(["git", "ls-remote", git_server.url], env)
        assert r.returncode == 0 and "refs/heads/main" in r.stdout, r.stderr
    finally:
        bridge.terminate()
        bridge.wait(5)


def test_ca_bundle_dir_holds_system_roots_and_the_session_ca(gate_for):
    gate = gate_for()
    d = gate.gate.ca_bundle_dir()
    bundle = (d / "ca-certificates.crt").read_bytes()
    session = gate.gate.ca_cert_path.read_bytes()
    assert session in bundle and bundle.count(b"BEGIN CERTIFICATE") > 1
    r = run(["openssl", "verify", "-no-CAfile", "-CApath", str(d), str(gate.gate.ca_cert_path)], os.environ)
    assert r.returncode == 0, r.stdout + r.stderr
    key = gate.gate.ca_cert_path.parent / "mitmproxy-ca.pem"
    assert (key.stat().st_mode & 0o777) == 0o600
    assert (key.parent.stat().st_mode & 0o777) == 0o700
    assert b"PRIVATE KEY" not in bundle


def test_the_session_ca_is_ecdsa_and_a_ca_made_before_is_kept(tmp_path):
    """proxy/ca.py makes the session CA (P-256, in mitmproxy's layout, the key 0600), once: a
    second call, or a CA an earlier envgit made with RSA, is left as it is."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from envgit.proxy import ca
    d = ca.ca_dir(tmp_path / "state")
    ca.make_session_ca(d)
    cert = x509.load_pem_x509_certificate((d / "mitmproxy-ca-cert.pem").read_bytes())
    key = load_pem_private_key((d / "mitmproxy-ca.pem").read_bytes(), None)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    assert cert.public_key() == key.public_key()
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert (d / "mitmproxy-ca.pem").stat().st_mode & 0o777 == 0o600
    assert not list(d.glob("*.tmp"))
    before = (d / "mitmproxy-ca.pem").read_bytes()
    ca.make_session_ca(d)
    assert (d / "mitmproxy-ca.pem").read_bytes() == before
    from mitmproxy.certs import CertStore
    old = tmp_path / "old"
    CertStore.create_store(old, "mitmproxy", 2048)          # how envgit's CA was made before
    was = (old / "mitmproxy-ca.pem").read_bytes()
    ca.make_session_ca(old)
    assert (old / "mitmproxy-ca.pem").read_bytes() == was
    assert isinstance(load_pem_private_key(was, None), rsa.RSAPrivateKey)
