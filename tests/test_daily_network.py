"""The network in daily use (issue 12, section 4): presets naming the hosts each client needs,
a loopback dev server reached at its own address, and package caches kept between sessions.

Everything runs the real way: `envgit run` with real bwrap, the daemon's gate, the real pip
and npm inside the sandbox, against HTTPS servers on 127.0.0.1 that stand in for pypi.org,
files.pythonhosted.org and registry.npmjs.org. The daemon maps those names to the local
server's port with ENVGIT_RESOLVE=name=127.0.0.1:PORT (test-only, the daemon's environment)
and trusts its CA with ENVGIT_UPSTREAM_CA; the step and its policy name the real hosts."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import ENVGIT, Env, make_home
from gitserver import HTTPSServer
from kit.registries import WHEEL, npm_app, npm_tarball, pypi_app, tgz, wheel

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

PIP = "/usr/bin/python3"


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def project(tmp_path, extra_env=None, policy="version: 1\n"):
    home = make_home(tmp_path)
    root = home / "proj"
    root.mkdir()
    env = Env(home, root, extra_env)
    env.envgit("init", check=True)
    env.write_policy(policy)
    return env


# --- presets: one list, shown everywhere -------------------------------------------------------


def test_presets_are_listed_by_policy_show_the_schema_and_the_template(tmp_path):
    from envgit.policy.defaults import NETWORK_PRESETS
    env = project(tmp_path, policy="version: 1\nnetwork:\n  allow: [preset:pypi, \"example.com\", preset:crates]\n")
    try:
        for name in ("pypi", "npm", "crates", "go", "github", "gitlab", "huggingface", "rubygems",
                     "maven", "dockerhub"):
            assert name in NETWORK_PRESETS
        assert {"pypi.org", "files.pythonhosted.org"} <= set(NETWORK_PRESETS["pypi"][0])
        assert {"crates.io", "index.crates.io", "static.crates.io"} <= set(NETWORK_PRESETS["crates"][0])
        assert {"proxy.golang.org", "sum.golang.org"} <= set(NETWORK_PRESETS["go"][0])
        assert {"github.com", "api.github.com", "codeload.github.com",
                "objects.githubusercontent.com"} <= set(NETWORK_PRESETS["github"][0])
        show = env.envgit("policy", "show", check=True).stdout
        # the preset's hosts, each with the line and the preset it came from
        for host in ("pypi.org", "files.pythonhosted.org", "static.crates.io"):
            line = next(ln for ln in show.splitlines() if ln.strip().startswith(f"- {host} "))
            assert line.rstrip().endswith("envgit.yaml:3 (preset:pypi)" if "crates" not in line
                                          else "envgit.yaml:3 (preset:crates)"), line
        assert next(ln for ln in show.splitlines() if "- example.com" in ln).rstrip().endswith("envgit.yaml:3")
        for name, (hosts, _) in NETWORK_PRESETS.items():        # every preset listed, with its hosts
            assert f"preset:{name}" in show and hosts[-1] in show
        pol = json.loads(env.envgit("policy", "show", "--json", check=True).stdout)
        assert pol["network_allow"][:2] == ["pypi.org", "files.pythonhosted.org"]
        assert pol["allow_presets"]["files.pythonhosted.org"] == "preset:pypi"
        assert "example.com" not in pol["allow_presets"]
        schema = json.loads(env.envgit("policy", "schema", check=True).stdout)
        item = schema["properties"]["network"]["properties"]["allow"]["items"]
        consts = {c.get("const") for c in item["anyOf"]}
        assert consts >= {f"preset:{n}" for n in NETWORK_PRESETS}
        from envgit.policy.defaults import TEMPLATE
        section = TEMPLATE[TEMPLATE.index("network:"):TEMPLATE.index("irreversible:")]
        for name in NETWORK_PRESETS:
            assert f"#   preset:{name} " in section
        # the template still loads, and its commented presets are only comments
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        subprocess.run([ENVGIT, "init"], cwd=fresh, env=env.env, check=True, capture_output=True)
        assert "preset:pypi" in (fresh / "envgit.yaml").read_text()
        # an unknown preset: one line naming file, line and the fix
        env.write_policy("version: 1\nnetwork:\n  allow:\n    - preset:pipy\n")
        r = env.envgit("policy", "check")
        assert r.returncode == 2 and "envgit.yaml:4:7" in r.stderr and "preset:pypi" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    finally:
        env.stop()


# --- real clients through presets, and caches that outlive the session ---------------------------


def _resolve(srv):
    return ",".join(f"{n}=127.0.0.1:{srv.port}" for n in srv.names)


def test_pip_install_through_preset_pypi_and_the_second_session_uses_the_cache(tmp_path):
    whl = wheel()
    with HTTPSServer(pypi_app(whl), ("pypi.org", "files.pythonhosted.org"), root=tmp_path / "srv") as srv:
        env = project(tmp_path, {"ENVGIT_RESOLVE": _resolve(srv), "ENVGIT_UPSTREAM_CA": str(srv.ca.cert_path)},
                      "version: 1\nnetwork:\n  allow: [preset:pypi]\n")
        # the machine's own pip.conf (extra indexes, find-links) is not the test's
        install = (f"PIP_CONFIG_FILE=/dev/null {PIP} -m pip install -q --disable-pip-version-check "
                   "--no-input --target deps --index-url https://pypi.org/simple/ envgit-tiny && "
                   f"PYTHONPATH=deps {PIP} -c 'import envgit_tiny; print(envgit_tiny.VALUE)'")
        try:
            r = env.run(install)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip().endswith("42")
            fetched = [p for m, p, s in srv.log if p.endswith(WHEEL)]
            assert len(fetched) == 1, srv.log
            reqs = steps(env)[-1]["requests"]
            assert {(q["host"], q["port"]) for q in reqs} >= {("pypi.org", 443), ("files.pythonhosted.org", 443)}, reqs
            assert all(q["decision"] == "allow" for q in reqs)
            # a new session (the daemon stopped), the package gone from the project
            env.stop()
            shutil.rmtree(env.root / "deps")
            r = env.run(install)
            assert r.returncode == 0, r.stderr
            assert r.stdout.strip().endswith("42")
            assert steps(env)[-1]["session"] != steps(env)[0]["session"]
            # the wheel came from the project's cache: the server was not asked again
            assert [p for m, p, s in srv.log if p.endswith(WHEEL)] == fetched, srv.log
            caches = list((env.home / ".cache" / "envgit").iterdir())
            assert len(caches) == 1 and (caches[0] / "pip").is_dir()
            assert not (env.home / ".cache" / "pip").exists()         # never the host's own cache
        finally:
            env.stop()


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_npm_install_through_preset_npm_and_the_second_session_uses_the_cache(tmp_path):
    with HTTPSServer(npm_app(npm_tarball()), ("registry.npmjs.org",), root=tmp_path / "srv") as srv:
        env = project(tmp_path, {"ENVGIT_RESOLVE": _resolve(srv), "ENVGIT_UPSTREAM_CA": str(srv.ca.cert_path)},
                      "version: 1\nnetwork:\n  allow: [preset:npm]\n")
        (env.root / "package.json").write_text('{"name": "app", "version": "0.0.0", "private": true}\n')
        install = ("npm install --no-audit --no-fund --no-update-notifier "
                   "--registry https://registry.npmjs.org/ envgit-tiny && "
                   "node -e 'console.log(require(\"envgit-tiny\"))'")
        try:
            r = env.run(install, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.strip().endswith("42")
            assert "Unknown env config" not in r.stderr, r.stderr     # no other tool's settings for npm
            tarballs = [p for m, p, s in srv.log if p.endswith(".tgz")]
            assert len(tarballs) == 1, srv.log
            reqs = steps(env)[-1]["requests"]
            assert any(q["host"] == "registry.npmjs.org" and q["path"] == "/envgit-tiny" and
                       q["decision"] == "allow" for q in reqs), reqs
            env.stop()
            shutil.rmtree(env.root / "node_modules")
            (env.root / "package-lock.json").unlink()
            r = env.run(install, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            assert r.stdout.strip().endswith("42")
            # the tarball came from the project's npm cache
            assert [p for m, p, s in srv.log if p.endswith(".tgz")] == tarballs, srv.log
            assert not (env.home / ".npm").exists()
        finally:
            env.stop()


def _crate():
    return tgz((("envgit-tiny-1.0.0/Cargo.toml",
                 b'[package]\nname = "envgit-tiny"\nversion = "1.0.0"\nedition = "2021"\n'),
                ("envgit-tiny-1.0.0/src/lib.rs", b"pub const VALUE: u32 = 42;\n")))


def crates_app(crate):
    """index.crates.io's sparse index and static.crates.io's files, as cargo reads them."""
    line = json.dumps({"name": "envgit-tiny", "vers": "1.0.0", "deps": [], "features": {},
                       "cksum": hashlib.sha256(crate).hexdigest(), "yanked": False}) + "\n"

    def app(method, path, headers, body):
        host = headers.get("host", "").split(":")[0]
        if host == "index.crates.io" and path == "/config.json":
            return 200, {"Content-Type": "application/json"}, \
                b'{"dl": "https://static.crates.io/crates", "api": "https://crates.io"}'
        if host == "index.crates.io" and path == "/en/vg/envgit-tiny":
            return 200, {"Content-Type": "text/plain", "ETag": '"v1"'}, line.encode()
        if host == "static.crates.io" and path == "/crates/envgit-tiny/1.0.0/download":
            return 200, {"Content-Type": "application/gzip"}, crate
        return 404, {"Content-Type": "text/plain"}, b"not here\n"
    return app


def _rust_toolchain():
    """The real cargo and rustc binaries (not rustup's proxies, which need ~/.rustup)."""
    try:
        cargo, rustc = (subprocess.run(["rustup", "which", t], capture_output=True, text=True,
                                       timeout=30).stdout.strip() for t in ("cargo", "rustc"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (cargo, rustc) if cargo and rustc else None


def test_cargo_fetch_through_preset_crates_and_the_second_session_uses_the_cache(tmp_path):
    tools = _rust_toolchain()
    if tools is None:
        pytest.skip("no rust toolchain (rustup) on this machine")
    cargo, rustc = tools
    toolchain = os.path.dirname(os.path.dirname(cargo))
    with HTTPSServer(crates_app(_crate()), ("crates.io", "index.crates.io", "static.crates.io"),
                     root=tmp_path / "srv") as srv:
        env = project(tmp_path, {"ENVGIT_RESOLVE": _resolve(srv), "ENVGIT_UPSTREAM_CA": str(srv.ca.cert_path)},
                      "version: 1\nnetwork:\n  allow: [preset:crates]\n"
                      f"filesystem:\n  allow_read: [\"{toolchain}\"]\n"
                      f"env:\n  set:\n    RUSTC: \"{rustc}\"\n")
        (env.root / "Cargo.toml").write_text('[package]\nname = "app"\nversion = "0.1.0"\nedition = "2021"\n\n'
                                            '[dependencies]\nenvgit-tiny = "1.0.0"\n')
        (env.root / "src").mkdir()
        (env.root / "src" / "lib.rs").write_text("pub use envgit_tiny::VALUE;\n")
        fetch = f"{cargo} fetch -q && ls \"$CARGO_HOME\"/registry/src/*/"
        try:
            r = env.run(fetch, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "envgit-tiny-1.0.0" in r.stdout
            crates = [p for m, p, s in srv.log if p.endswith("/download")]
            assert len(crates) == 1, srv.log
            env.stop()
            (env.root / "Cargo.lock").unlink()
            r = env.run(fetch, timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            assert [p for m, p, s in srv.log if p.endswith("/download")] == crates, srv.log
            assert not (env.home / ".cargo").exists()
        finally:
            env.stop()


# --- a dev server on the host's loopback ----------------------------------------------------------


class _Recorder(BaseHTTPRequestHandler):
    def do_GET(self):
        self.server.hits.append(self.path)
        body = f"dev server {self.server.server_address[1]}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class DevServer:
    """A plain HTTP server on the host's 127.0.0.1 (or ::1), recording the paths it served."""

    def __init__(self, family=socket.AF_INET):
        cls = type("S", (ThreadingHTTPServer,), {"address_family": family})
        self.httpd = cls(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0), _Recorder)
        self.httpd.hits = []
        self.port = self.httpd.server_address[1]

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def hits(self):
        return self.httpd.hits


def test_a_loopback_host_in_network_allow_is_reached_at_its_own_address(tmp_path):
    with DevServer() as dev, DevServer() as other:
        env = project(tmp_path, policy=f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{dev.port}"]\n')
        try:
            # curl (honours NO_PROXY), Python's urllib (honours it too), Node's fetch (ignores
            # the proxy variables): all reach it at the address the policy names
            r = env.run(f"curl -sS http://127.0.0.1:{dev.port}/curl && "
                        f"{PIP} -c 'import urllib.request as u; "
                        f"print(u.urlopen(\"http://127.0.0.1:{dev.port}/py\").read().decode())' && "
                        f"node -e 'fetch(\"http://127.0.0.1:{dev.port}/node\")"
                        ".then(r => r.text()).then(t => process.stdout.write(t))'")
            assert r.returncode == 0, r.stderr
            assert r.stdout.count(f"dev server {dev.port}") == 3
            assert sorted(dev.hits) == ["/curl", "/node", "/py"]
            reqs = steps(env)[-1]["requests"]
            assert sorted(q["path"] for q in reqs if q["decision"] == "allow" and q["host"] == "127.0.0.1"
                          and q["port"] == dev.port) == ["/curl", "/node", "/py"], reqs
            shown = env.envgit("show", "last", check=True).stdout       # the port, as the person reads it
            assert f"http://127.0.0.1:{dev.port}/curl -> 200" in shown, shown
            # another port on the same loopback: not listed, not reached, whatever the way
            r = env.run(f"curl -sS -m 5 http://127.0.0.1:{other.port}/direct; "
                        f"curl -sS -m 5 --noproxy '' http://127.0.0.1:{other.port}/proxied; "
                        f"curl -sS -m 5 --noproxy '' http://localhost:{dev.port}/other-name")
            assert other.hits == [] and "/other-name" not in dev.hits
            denied = [q for q in steps(env)[-1]["requests"] if q["decision"] == "deny"]
            assert {(q["host"], q["port"]) for q in denied} == {("127.0.0.1", other.port),
                                                                ("localhost", dev.port)}, denied
            # a server a step starts inside, on another port, is still its own (NO_PROXY); given
            # 30 s to listen, not 5: a Python start on a loaded machine
            r = env.run(f"{PIP} -m http.server 18999 --bind 127.0.0.1 >/dev/null 2>&1 & "
                        "for i in $(seq 300); do curl -s -o /dev/null http://127.0.0.1:18999/ && break; "
                        "sleep 0.1; done; "
                        "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18999/; kill %1")
            assert r.stdout.endswith("200"), r.stdout + r.stderr
        finally:
            env.stop()


def test_localhost_entry_reaches_a_server_on_either_loopback(tmp_path):
    if not socket.has_ipv6 or not os.path.exists("/proc/net/if_inet6"):
        pytest.skip("no IPv6 on this machine")
    with DevServer(socket.AF_INET6) as dev:
        env = project(tmp_path, policy=f'version: 1\nnetwork:\n  allow: ["localhost:{dev.port}"]\n')
        try:
            r = env.run(f"curl -sS http://localhost:{dev.port}/name && curl -sS -4 http://localhost:{dev.port}/v4")
            assert r.returncode == 0, r.stderr
            assert dev.hits == ["/name", "/v4"]
            reqs = steps(env)[-1]["requests"]
            assert [(q["host"], q["port"], q["decision"]) for q in reqs] == [("localhost", dev.port, "allow")] * 2
        finally:
            env.stop()


def test_which_loopback_entries_get_a_forwarder():
    from envgit.sandbox.loopback import forwards, wrap
    allow = ["localhost", "localhost:80", "127.0.0.1:8000", "localhost:5173", "[::1]:4873",
             "127.0.0.1:8000", "example.com:8000", "127.0.0.2:9000", "*.localhost:3000", "LOCALHOST.:6006"]
    # below 1024 nobody in the sandbox may bind; without a port it is 80/443; other hosts
    # (127.0.0.2 included) are not in NO_PROXY, so clients send them to the proxy already
    assert forwards(allow) == [("127.0.0.1", 8000), ("localhost", 5173), ("::1", 4873), ("localhost", 6006)]
    argv = wrap(["echo", "hi"], forwards(["127.0.0.1:8000", "localhost:8000"]), "step1:pw")
    script = argv[2]
    assert argv[3:] == ["envgit-loopback", "echo", "hi"]
    assert script.count("TCP4-LISTEN:8000") == 1 and script.count("TCP6-LISTEN:8000") == 1
    assert "PROXY:127.0.0.1:127.0.0.1:8000,proxyport=3128,proxyauth=step1:pw" in script
    assert "PROXY:127.0.0.1:localhost:8000" in script                   # the v6 side of localhost
    assert wrap(["true"], [], "x") == ["true"]
