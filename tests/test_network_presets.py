"""Every preset fires on a request shaped as the real client sends it (the real client where it
runs offline: npm), and the bypass attempts a step could make get a denial. All servers are
on 127.0.0.1; names are mapped to it the way ENVGIT_RESOLVE does."""

import base64
import gzip
import json
import os
import socket
import ssl
import threading
import zlib

import pytest

from gitserver import GitServer, HTTPSServer
from test_network_gate import GateRunner, policy, run

NAMES = ("registry.npmjs.org", "upload.pypi.org", "api.github.com", "uploads.github.com",
         "gitlab.com", "ghcr.io", "crates.io", "huggingface.co", "stub.example.test")


def app(method, path, headers, body):
    return 200, {"Content-Type": "application/json"}, b'{"ok": true}'


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A stub for the registries and forges, a git server, a raw TCP sink, one gate."""
    root = tmp_path_factory.mktemp("world")
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(8)
    sink.settimeout(0.2)
    received = []

    def drain():
        while not stop.is_set():
            try:
                c, _ = sink.accept()
            except OSError:
                continue
            c.settimeout(1)
            try:
                received.append(c.recv(4096))
            except OSError:
                pass
            c.close()
    stop = threading.Event()
    threading.Thread(target=drain, daemon=True).start()
    with GitServer(root=root / "git") as git, HTTPSServer(app, NAMES, root=root / "stub", ca=git.ca) as stub:
        sink_port = sink.getsockname()[1]
        allow = [f"{n}:{stub.port}" for n in NAMES] + [f"git.example.test:{git.port}",
                                                      f"files.pythonhosted.org:{sink_port}"]
        resolve = {n: "127.0.0.1" for n in NAMES + ("git.example.test", "files.pythonhosted.org")}
        gate = GateRunner(policy(allow), resolve, git.ca.cert_path, root=root / "gate")
        cred = gate.step(1)
        yield type("World", (), dict(gate=gate, git=git, stub=stub, cred=cred, env=gate.env(cred),
                                     sink_port=sink_port, received=received))
        gate.stop()
        stop.set()
        sink.close()


def curl(world, *args, data=None):
    """(status, body) of a curl request through the gate."""
    r = run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", *args], world.env,
            input=data.decode("latin-1") if isinstance(data, bytes) else data)
    body, _, status = r.stdout.rpartition("\n")
    return status, body


def last_record(world, **match):
    recs = [r for r in world.gate.recs(1) if all(r.get(k) == v for k, v in match.items())]
    return recs[-1]


def url(world, name, path):
    return f"https://{name}:{world.stub.port}{path}"


# --- registries and forges ---------------------------------------------------------------------

def test_real_npm_publish_is_denied(world, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "package.json").write_text(json.dumps({"name": "envgit-tiny-pkg", "version": "0.0.1"}))
    (pkg / "index.js").write_text("module.exports = 1\n")
    registry = f"https://registry.npmjs.org:{world.stub.port}/"
    env = {**world.env, "npm_config_cache": str(tmp_path / "cache"), "npm_config_update_notifier": "false",
           "npm_config_audit": "false", "npm_config_fund": "false"}
    before = len(world.stub.requests)
    r = run(["npm", "publish", "--registry", registry,
             f"--//registry.npmjs.org:{world.stub.port}/:_authToken=test-token"], env, cwd=pkg, timeout=120)
    assert r.returncode != 0
    assert "403" in r.stderr or "E403" in r.stderr, r.stderr
    assert not [q for q in world.stub.requests[before:] if q["method"] == "PUT"]
    rec = last_record(world, method="PUT")
    assert rec["path"] == "/envgit-tiny-pkg" and rec["rule"] == "preset:default/npm-publish"
    assert rec["decision"] == "deny" and rec["kind"] == "npm publish"


@pytest.mark.parametrize("method,name,path,rule", [
    ("DELETE", "registry.npmjs.org", "/envgit-tiny-pkg/-rev/1-abc", "npm-unpublish"),
    ("PUT", "registry.npmjs.org", "/-/package/envgit-tiny-pkg/dist-tags/beta", "npm-dist-tag"),
    ("PUT", "crates.io", "/api/v1/crates/new", "cargo-publish"),
    ("DELETE", "crates.io", "/api/v1/crates/foo/1.0.0/yank", "cargo-yank"),
    ("PUT", "crates.io", "/api/v1/crates/foo/owners", "cargo-owners"),
    ("POST", "ghcr.io", "/v2/me/img/blobs/uploads/", "oci-push"),
    ("PUT", "ghcr.io", "/v2/me/img/manifests/latest", "oci-push"),
    ("DELETE", "ghcr.io", "/v2/me/img/manifests/sha256:00", "oci-delete"),
    ("POST", "api.github.com", "/repos/me/app/issues", "github-rest-write"),
    ("POST", "uploads.github.com", "/repos/me/app/releases/1/assets?name=a.tgz", "github-rest-write"),
    ("PUT", "gitlab.com", "/api/v4/projects/1/repository/files/README", "gitlab-rest-write"),
    ("POST", "huggingface.co", "/api/repos/create", "huggingface-repo-write"),
    ("POST", "huggingface.co", "/api/models/me/m/commit/main", "huggingface-repo-write"),
    ("POST", "huggingface.co", "/api/models/me/m/super-squash/main", "huggingface-repo-write"),
    ("POST", "huggingface.co", "/api/spaces/me/s/secrets", "huggingface-repo-write"),
    ("POST", "gitlab.com", "/api/graphql.json", "gitlab-graphql-mutation"),
    ("PUT", "api.github.com", "/graphql", "github-graphql-method"),
])
def test_preset_fires_on_the_wire(world, method, name, path, rule):
    before = len(world.stub.requests)
    status, body = curl(world, "-X", method, "-H", "Content-Type: application/json",
                        "--data-binary", "{}", url(world, name, path))
    assert status == "403", body
    assert f"by rule preset:default/{rule}" in body and "envgit.yaml" in body
    assert len(world.stub.requests) == before                     # never reached the server
    rec = last_record(world, method=method)
    assert rec["rule"] == f"preset:default/{rule}" and rec["status"] == 403


def test_reads_go_through(world):
    for u in [url(world, "api.github.com", "/repos/me/app"), url(world, "registry.npmjs.org", "/x"),
              url(world, "ghcr.io", "/v2/me/img/manifests/latest")]:
        assert curl(world, u)[0] == "200"
    status, _ = curl(world, "-X", "POST", "--data-binary", "{}",
                     url(world, "registry.npmjs.org", "/-/npm/v1/security/advisories/bulk"))
    assert status == "200"                                        # npm audit is a read


def test_twine_shaped_upload(world, tmp_path):
    dist = tmp_path / "tiny-0.1.tar.gz"
    dist.write_bytes(gzip.compress(b"tiny"))
    status, body = curl(world, "-F", ":action=file_upload", "-F", "protocol_version=1",
                        "-F", "name=tiny", "-F", "version=0.1", "-F", f"content=@{dist}",
                        "-u", "__token__:pypi-test", url(world, "upload.pypi.org", "/legacy/"))
    assert status == "403" and "preset:default/pypi-upload" in body


GQL_MUTATION = {"query": "mutation($id: ID!) { addStar(input: {starrableId: $id}) { clientMutationId } }",
                "variables": {"id": "R_1"}}


@pytest.mark.parametrize("payload", [
    GQL_MUTATION,
    {"query": "# a comment, then\nmutation { addStar(input:{starrableId:\"x\"}) { clientMutationId } }"},
    {"query": "query A { viewer { login } }\nmutation B { deleteRepository(input:{}) { x } }",
     "operationName": "B"},
    [{"query": "{ viewer { login } }"}, GQL_MUTATION],
    {"extensions": {"persistedQuery": {"version": 1, "sha256Hash": "ab" * 32}}},
])
def test_graphql_mutations_gh_shaped(world, payload):
    status, body = curl(world, "-X", "POST", "-H", "Content-Type: application/json",
                        "-H", "Authorization: bearer t", "--data-binary", json.dumps(payload),
                        url(world, "api.github.com", "/graphql"))
    assert status == "403" and "github-graphql-mutation" in body


def test_graphql_query_goes_through(world):
    status, _ = curl(world, "-X", "POST", "-H", "Content-Type: application/json",
                     "--data-binary", json.dumps({"query": "query { viewer { login } }"}),
                     url(world, "api.github.com", "/graphql"))
    assert status == "200"


def _compress(kind, data):
    if kind == "gzip":
        return gzip.compress(data)
    if kind == "deflate":
        return zlib.compress(data)
    if kind == "br":
        import brotli
        return brotli.compress(data)
    import zstandard
    return zstandard.ZstdCompressor().compress(data)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd"])
def test_compressed_graphql_mutation_is_decoded_first(world, tmp_path, encoding):
    f = tmp_path / "body"
    f.write_bytes(_compress(encoding, json.dumps(GQL_MUTATION).encode()))
    status, body = curl(world, "-X", "POST", "-H", "Content-Type: application/json",
                        "-H", f"Content-Encoding: {encoding}", "--data-binary", f"@{f}",
                        url(world, "api.github.com", "/graphql"))
    assert status == "403" and "github-graphql-mutation" in body


def test_undecodable_body_on_a_body_rule_is_denied(world):
    status, _ = curl(world, "-X", "POST", "-H", "Content-Type: application/json",
                     "-H", "Content-Encoding: gzip", "--data-binary", "not gzip at all",
                     url(world, "api.github.com", "/graphql"))
    assert status == "403"


def test_http2_requests_are_judged(world):
    status, body = curl(world, "--http2", "-X", "POST", "--data-binary", "{}",
                        url(world, "api.github.com", "/repos/me/app/issues"))
    assert status == "403" and "github-rest-write" in body
    assert curl(world, "--http2", url(world, "api.github.com", "/repos/me/app"))[0] == "200"


# --- bypass attempts ---------------------------------------------------------------------------

def proxy_socket(world):
    s = socket.create_connection(world.gate.gate.tcp_address, timeout=10)
    return s


def auth(world):
    return "Proxy-Authorization: Basic " + base64.b64encode(world.cred.encode()).decode()


def read_response(s, limit=65536):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(rest) < length:
        chunk = s.recv(4096)
        if not chunk:
            break
        rest += chunk
    return status, head.decode("latin-1"), rest


def connect(world, target, sni=None):
    """A TLS connection to `target` through a CONNECT tunnel (trusting the session CA)."""
    s = proxy_socket(world)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth(world)}\r\n\r\n".encode())
    status, head, _ = read_response(s)
    assert status == 200, head
    ctx = ssl.create_default_context(cafile=str(world.gate.cafile))
    ctx.check_hostname = False
    return ctx.wrap_socket(s, server_hostname=sni or target.rsplit(":", 1)[0])


@pytest.mark.parametrize("target", ["git.example.test:22", "ssh.github.com:443", "altssh.gitlab.com:443"])
def test_ssh_is_refused(world, target):
    s = proxy_socket(world)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth(world)}\r\n\r\n".encode())
    status, _, body = read_response(s)
    assert status == 403 and b"https remote" in body


def test_ssh_banner_inside_an_allowed_tunnel_never_reaches_the_server(world):
    s = proxy_socket(world)
    target = f"files.pythonhosted.org:{world.sink_port}"        # allowed and tunnelled
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth(world)}\r\n\r\n".encode())
    assert read_response(s)[0] == 200
    s.sendall(b"SSH-2.0-OpenSSH_9.6\r\n" + os.urandom(64))
    s.settimeout(3)
    try:
        s.recv(4096)
    except OSError:
        pass
    s.close()
    assert not any(b"SSH-2.0" in chunk for chunk in world.received)


def test_sni_mismatch_denied(world):
    t = connect(world, f"git.example.test:{world.git.port}", sni="evil.example.test")
    t.sendall(f"GET /repo.git/info/refs HTTP/1.1\r\nHost: git.example.test:{world.git.port}\r\n\r\n".encode())
    status, _, body = read_response(t)
    assert status == 403 and b"builtin:authority-mismatch" in body


def test_host_header_mismatch_denied(world):
    status, body = curl(world, "-H", "Host: evil.example.test",
                        f"https://git.example.test:{world.git.port}/repo.git/info/refs")
    assert status == "403" and "authority-mismatch" in body


@pytest.mark.parametrize("host_header", ["evil.example.test", "git.example.test:{port}"])
def test_absolute_form_inside_a_tunnel_denied(world, host_header):
    t = connect(world, f"git.example.test:{world.git.port}")
    hh = host_header.format(port=world.git.port)
    t.sendall(f"GET https://evil.example.test/x HTTP/1.1\r\nHost: {hh}\r\n\r\n".encode())
    status, _, body = read_response(t)
    assert status == 403 and b"authority-mismatch" in body


def test_request_smuggling_rejected(world):
    before = [x for x in world.git.log if x[1].endswith("git-receive-pack")]
    t = connect(world, f"git.example.test:{world.git.port}")
    hp = f"git.example.test:{world.git.port}"
    smuggled = (f"POST /repo.git/git-receive-pack HTTP/1.1\r\nHost: {hp}\r\n"
                f"Content-Length: 4\r\n\r\n0000")
    t.sendall((f"POST /repo.git/git-upload-pack HTTP/1.1\r\nHost: {hp}\r\n"
               f"Content-Length: {len(smuggled) + 5}\r\nTransfer-Encoding: chunked\r\n\r\n"
               f"0\r\n\r\n{smuggled}").encode())
    status, _, _ = read_response(t)
    assert status == 400
    assert [x for x in world.git.log if x[1].endswith("git-receive-pack")] == before


def test_plain_http_gets_the_same_rules(world):
    status, body = curl(world, "-X", "POST", "--data-binary", "0094" + "0" * 40 + " " + "1" * 40 + " refs/heads/main",
                        f"http://git.example.test:{world.git.port}/repo.git/git-receive-pack")
    assert status == "403" and "preset:default/git-push" in body
    status, body = curl(world, "-X", "POST", "--data-binary", "{}",
                        f"http://api.github.com:{world.stub.port}/repos/me/app/issues")
    assert status == "403" and "github-rest-write" in body
    status, body = curl(world, "http://evil.example.test/")
    assert status == "403" and "network.allow" in body


def test_websocket_to_a_denied_host(world):
    s = proxy_socket(world)
    s.sendall((f"GET http://evil.example.test/ws HTTP/1.1\r\nHost: evil.example.test\r\n{auth(world)}\r\n"
               "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
               "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n").encode())
    status, _, body = read_response(s)
    assert status == 403 and b"network.allow" in body
    s = proxy_socket(world)
    s.sendall(f"CONNECT evil.example.test:443 HTTP/1.1\r\nHost: evil.example.test:443\r\n"
              f"{auth(world)}\r\n\r\n".encode())
    assert read_response(s)[0] == 403


@pytest.mark.parametrize("u", ["https://169.254.169.254/latest/meta-data/",
                               "http://169.254.169.254/latest/meta-data/",
                               "http://[fd00:ec2::254]/latest/meta-data/",
                               "http://metadata.google.internal/computeMetadata/v1/",
                               "https://127.0.0.1:{port}/repo.git/info/refs",
                               "http://2130706433:{port}/"])
def test_ip_literals_and_metadata_denied(world, u):
    status, body = curl(world, u.format(port=world.git.port))
    assert status in ("403", "000"), body
    rec = world.gate.recs(1)[-1]
    assert rec["decision"] == "deny" and rec["rule"] == "builtin:special-address"
