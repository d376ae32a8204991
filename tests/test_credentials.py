"""Credentials kept outside the sandbox (issue 13), the real way: `envgit run` in real bwrap,
the daemon's gate, real git, curl and npm inside, against HTTPS servers on 127.0.0.1 that
require the real token (a git http-backend behind HTTP Basic, an npm registry behind a
Bearer token). The real token is only in the environment of the person's `envgit run`; the
step sees a placeholder, and the gate swaps the real value in on the way to the credential's
host only."""

import base64
import hashlib
import json
import os
import shutil
import subprocess

import pytest

from conftest import Env, make_home
from gitserver import GitServer, HTTPSServer
from kit.registries import tgz

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")

REAL = "ghp_REALtokenREALtokenREALtokenREAL12345"        # the person's token: never inside
NPM_REAL = "npm_REALnpmREALnpmREALnpmREALnpm1234"


class AuthGitServer(GitServer):
    """The git http-backend behind HTTP Basic: 401 unless the password is the real token.
    `auths` holds every Authorization value it received (the server's log)."""

    def __init__(self, token, **kw):
        super().__init__(**kw)
        self.token, self.auths = token, []

    def _cgi(self, method, path, headers, body):
        auth = headers.get("authorization", "")
        self.auths.append(auth)
        scheme, _, b64 = auth.partition(" ")
        ok = False
        if scheme.lower() == "basic":
            try:
                ok = base64.b64decode(b64).decode().partition(":")[2] == self.token
            except ValueError:
                ok = False
        if not ok:
            return 401, {"WWW-Authenticate": 'Basic realm="private"', "Content-Type": "text/plain"}, b"no\n"
        return super()._cgi(method, path, headers, body)


def _stub(method, path, headers, body):
    if "authorization" not in headers:          # so git sends what it has after a 401
        return 401, {"WWW-Authenticate": 'Basic realm="stub"', "Content-Type": "text/plain"}, b"who\n"
    return 200, {"Content-Type": "text/plain"}, b"stub\n"


def carried_nothing(stub):
    """No request that reached the second server carried a credential of any kind."""
    return all("authorization" not in q["headers"] and "token" not in q["path"] and
               "x-api-key" not in q["headers"] for q in stub.requests)


def hostport(srv, name=None):
    return f"{name or srv.names[0]}:{srv.port}"


@pytest.fixture
def world(tmp_path):
    """A private git server (credential host), a second allowed server (not a credential host),
    and a project whose person has the token in their environment only."""
    with AuthGitServer(REAL, root=tmp_path / "git") as git, \
            HTTPSServer(_stub, ("stub.example.test",), root=tmp_path / "stub", ca=git.ca) as stub:
        home = make_home(tmp_path)
        root = home / "proj"
        root.mkdir()
        env = Env(home, root, {"ENVGIT_RESOLVE": f"{git.resolve},{stub.resolve}",
                               "ENVGIT_UPSTREAM_CA": str(git.ca.cert_path), "MY_GH_TOKEN": REAL})
        env.envgit("init", check=True)
        env.write_policy(
            "version: 1\n"
            f"network:\n  allow: [\"{hostport(git)}\", \"{hostport(stub)}\"]\n"
            "irreversible:\n  - preset: default\n"
            "credentials:\n  github:\n    from: { env: MY_GH_TOKEN }\n"
            f"    hosts: [\"{hostport(git)}\"]\n")
        env.envgit("trust", "--yes", check=True)    # the person approves the credential
        try:
            yield env, git, stub
        finally:
            env.stop()


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def test_clone_and_fetch_with_the_token_only_outside(world):
    env, git, stub = world
    r = env.run(f"git clone -q {git.url} r && cd r && git fetch -q origin && git log --format=%s -1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "initial"
    real = "Basic " + base64.b64encode(f"x-access-token:{REAL}".encode()).decode()
    assert real in git.auths                          # the real token arrived, server side
    assert not stub.requests                          # and only there
    reqs = steps(env)[-1]["requests"]
    swapped = [q for q in reqs if q.get("credential") == "github"]
    assert swapped and all(q["host"] == "git.example.test" for q in swapped), reqs
    assert REAL not in json.dumps(reqs)


def test_inside_only_the_placeholder(world):
    env, git, stub = world
    hp = hostport(git)
    r = env.run("env; tr '\\0' '\\n' < /proc/self/environ; git config -l; "
                f"printf 'protocol=https\\nhost={hp}\\n\\n' | git credential fill; "
                "grep -rs . $HOME /tmp 2>/dev/null | grep -c ghp_ || true")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert REAL not in out and REAL not in r.stderr
    ph = [line.split("=", 1)[1] for line in out.splitlines() if line.startswith("MY_GH_TOKEN=")][0]
    assert ph.startswith("ghp_") and len(ph) == len(REAL) and ph != REAL    # shaped like the real one
    assert f"GITHUB_TOKEN={ph}" in out and f"GH_TOKEN={ph}" in out
    assert f"password={ph}" in out                    # git credential fill answers the placeholder
    assert "credential.https://" + hp + ".helper" in out
    # the host's own files were not written: the helper lives in the environment
    assert not (env.home / ".gitconfig").exists()


@pytest.mark.parametrize("how", [
    "curl -s -o /dev/null -w '%{{http_code}}' -H \"Authorization: Bearer $MY_GH_TOKEN\" {url}/",
    "curl -s -o /dev/null -w '%{{http_code}}' \"{url}/api?access_token=$MY_GH_TOKEN\"",
    "curl -s -o /dev/null -w '%{{http_code}}' -u \"x-access-token:$MY_GH_TOKEN\" {url}/",
    "curl -s -o /dev/null -w '%{{http_code}}' -H \"X-Api-Key: $MY_GH_TOKEN\" {url}/",
    "git ls-remote https://x-access-token:$MY_GH_TOKEN@{host}/repo.git; echo 403",
])
def test_placeholder_to_another_allowed_host_is_denied_and_marked(world, how):
    env, git, stub = world
    r = env.run(how.format(url=stub.url_for(), host=hostport(stub)))
    assert r.stdout.strip().endswith("403"), r.stdout + r.stderr
    assert carried_nothing(stub)                      # the second server received nothing of it
    if how.startswith("curl"):
        assert not stub.requests                      # (curl's one request never left)
    s = steps(env)[-1]
    assert "credential-misuse" in s["marks"], s["marks"]
    bad = [q for q in s["requests"] if q.get("rule") == "credential-misuse"]
    assert bad and bad[0]["credential"] == "github" and bad[0]["host"] == "stub.example.test"
    assert bad[0]["decision"] == "deny"
    assert not git.auths or all(REAL not in a for a in git.auths)


def test_git_remote_rewritten_to_another_host_is_denied(world):
    env, git, stub = world
    r = env.run(f"git clone -q {git.url} r && cd r && "
                f"git -c credential.helper= -c 'credential.helper=!f() {{ echo username=x; "
                f"echo password=$MY_GH_TOKEN; }}; f' ls-remote https://{hostport(stub)}/repo.git")
    assert r.returncode != 0
    assert stub.requests and carried_nothing(stub)   # asked (401), then the placeholder was stopped
    assert "credential-misuse" in steps(env)[-1]["marks"]


def test_push_with_the_credential_is_still_denied_by_the_preset(world):
    env, git, stub = world
    before = git.refs()
    r = env.run(f"git clone -q {git.url} r && cd r && git -c user.email=a@b -c user.name=a "
                "commit -q --allow-empty -m x && git push origin main")
    assert r.returncode != 0
    assert "preset:default/git-push" in r.stderr, r.stderr
    assert git.refs() == before


def test_policy_show_lists_credentials_and_doctor_checks_them_without_values(world):
    env, git, stub = world
    r = env.envgit("policy", "show", check=True)
    assert "credential github: from env 'MY_GH_TOKEN'" in r.stdout
    assert REAL not in r.stdout
    r = env.envgit("doctor")
    assert "credential github" in r.stdout + r.stderr and REAL not in r.stdout + r.stderr
    r = env.envgit("doctor", env={"MY_GH_TOKEN": ""})
    assert "MY_GH_TOKEN is not set" in r.stdout + r.stderr


def test_env_pass_of_a_credential_source_is_refused(world):
    env, git, stub = world
    text = (env.root / "envgit.yaml").read_text()
    env.write_policy(text + "env:\n  pass: [MY_GH_TOKEN]\n")
    r = env.run("echo $MY_GH_TOKEN")
    assert r.returncode != 0
    assert "env.pass names MY_GH_TOKEN" in r.stderr and "envgit.yaml:" in r.stderr, r.stderr
    assert REAL not in r.stdout + r.stderr


def _npm_tarball():
    return tgz((("package/package.json", b'{"name": "private-tiny", "version": "1.0.0", "main": "index.js"}\n'),
                ("package/index.js", b"module.exports = 'private';\n")))


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
def test_npm_install_from_a_token_requiring_registry(tmp_path):
    tarball = _npm_tarball()
    seen = []
    holder = {}

    def app(method, path, headers, body):
        seen.append(headers.get("authorization", ""))
        if headers.get("authorization") != f"Bearer {NPM_REAL}":
            return 401, {"Content-Type": "application/json", "WWW-Authenticate": "Bearer"}, b'{"error": "auth"}'
        base = f"https://npm.example.test:{holder['port']}"
        if path == "/private-tiny":
            doc = {"name": "private-tiny", "dist-tags": {"latest": "1.0.0"},
                   "versions": {"1.0.0": {"name": "private-tiny", "version": "1.0.0", "main": "index.js",
                                          "dist": {"tarball": f"{base}/private-tiny/-/private-tiny-1.0.0.tgz",
                                                   "integrity": "sha512-" + base64.b64encode(
                                                       hashlib.sha512(tarball).digest()).decode(),
                                                   "shasum": hashlib.sha1(tarball).hexdigest()}}}}
            return 200, {"Content-Type": "application/json"}, json.dumps(doc).encode()
        if path == "/private-tiny/-/private-tiny-1.0.0.tgz":
            return 200, {"Content-Type": "application/octet-stream"}, tarball
        return 404, {"Content-Type": "application/json"}, b'{"error": "not found"}'

    with HTTPSServer(app, ("npm.example.test",), root=tmp_path / "srv") as srv:
        holder["port"] = srv.port
        home = make_home(tmp_path)
        root = home / "proj"
        root.mkdir()
        env = Env(home, root, {"ENVGIT_RESOLVE": srv.resolve, "ENVGIT_UPSTREAM_CA": str(srv.ca.cert_path),
                               "NPM_TOKEN": NPM_REAL})
        env.envgit("init", check=True)
        hp = hostport(srv)
        env.write_policy(f"version: 1\nnetwork:\n  allow: [\"{hp}\"]\n"
                         f"credentials:\n  npm:\n    from: {{ env: NPM_TOKEN }}\n    hosts: [\"{hp}\"]\n")
        env.envgit("trust", "--yes", check=True)
        (root / "package.json").write_text('{"name": "app", "version": "0.0.0", "private": true}\n')
        try:
            r = env.run(f"npm install --no-audit --no-fund --no-update-notifier --registry https://{hp}/ "
                        "private-tiny && node -e 'console.log(require(\"private-tiny\"))' && "
                        "env | grep -c npm_ && (grep -rs NPM_REAL $HOME /tmp; true)", timeout=180)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "private" in r.stdout
            assert f"Bearer {NPM_REAL}" in seen               # the server got the real token
            assert NPM_REAL not in r.stdout + r.stderr
            reqs = steps(env)[-1]["requests"]
            assert any(q.get("credential") == "npm" for q in reqs), reqs
            lock = (root / "package-lock.json").read_text()
            assert NPM_REAL not in lock
        finally:
            env.stop()


def test_no_real_value_in_the_journal_the_daemon_log_or_json(world):
    env, git, stub = world
    env.run(f"git clone -q {git.url} r; curl -s -H \"Authorization: token $MY_GH_TOKEN\" {stub.url_for()}/")
    outs = [env.envgit(*a).stdout for a in (("log", "--json"), ("show", "--json", "1"),
                                            ("show", "1"), ("policy", "show"))]
    assert all(REAL not in o for o in outs)
    state = env.root / ".envgit"
    r = subprocess.run(["grep", "-rlaF", REAL, str(state)], capture_output=True, text=True)
    assert r.stdout == "", r.stdout                   # journal, objects, daemon log
    assert any("credential" in o for o in outs)


# --- AWS: SigV4 re-signed at the gate ------------------------------------------------------
# The local S3-compatible server verifies SigV4 with the same library the gate signs with
# (botocore, envgit.proxy.sigv4.sign as of the request's own X-Amz-Date): a stand-in for S3,
# which cannot run here. The client inside is real: curl --aws-sigv4.

AWS_KEY, AWS_SECRET = "AKIAREALKEYREAL12345", "realSecretrealSecretrealSecretrealSecret"


def s3_app(seen):
    from envgit.proxy.sigv4 import parse, sign

    def app(method, path, headers, body):
        p = parse(headers.get("authorization", ""))
        ok = False
        if p and p["key_id"] == AWS_KEY:
            signed = {k: headers[k] for k in p["signed"] if k in headers and k != "x-amz-date"}
            want = sign(method, f"https://{headers['host']}{path}", signed, body, p["service"],
                        p["region"], AWS_KEY, AWS_SECRET, timestamp=headers.get("x-amz-date"))
            ok = want["Authorization"] == headers["authorization"]
        seen.append((headers.get("authorization", ""), ok))
        return (200, {"Content-Type": "text/plain"}, b"object\n") if ok else \
            (403, {"Content-Type": "text/plain"}, b"SignatureDoesNotMatch\n")
    return app


@pytest.mark.skipif(subprocess.run(["curl", "--help", "all"], capture_output=True, text=True).stdout.find(
    "--aws-sigv4") < 0, reason="curl has no --aws-sigv4")
def test_aws_request_is_resigned_with_the_real_key_and_refused_elsewhere(tmp_path):
    pytest.importorskip("botocore")
    seen = []
    with HTTPSServer(s3_app(seen), ("s3.example.test",), root=tmp_path / "s3") as s3, \
            HTTPSServer(_stub, ("stub.example.test",), root=tmp_path / "stub", ca=s3.ca) as stub:
        home = make_home(tmp_path)
        with open(home / ".aws" / "credentials", "a") as f:
            f.write(f"\n[envgit-test]\naws_access_key_id = {AWS_KEY}\naws_secret_access_key = {AWS_SECRET}\n")
        root = home / "proj"
        root.mkdir()
        env = Env(home, root, {"ENVGIT_RESOLVE": f"{s3.resolve},{stub.resolve}",
                               "ENVGIT_UPSTREAM_CA": str(s3.ca.cert_path)})
        env.envgit("init", check=True)
        env.write_policy(f"version: 1\nnetwork:\n  allow: [\"{hostport(s3)}\", \"{hostport(stub)}\"]\n"
                         f"credentials:\n  aws:\n    from: {{ profile: envgit-test }}\n"
                         f"    hosts: [\"{hostport(s3)}\"]\n")
        env.envgit("trust", "--yes", check=True)
        get = ("curl -s -w ' %{{http_code}}' --aws-sigv4 aws:amz:us-east-1:s3 "
               "--user \"$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY\" {url}/bucket/key")
        try:
            r = env.run("env | grep ^AWS_; " + get.format(url=s3.url_for()))
            assert AWS_KEY not in r.stdout and AWS_SECRET not in r.stdout
            assert "AWS_ACCESS_KEY_ID=AKIA" in r.stdout
            assert r.stdout.strip().endswith("object\n 200"), r.stdout + r.stderr
            assert seen and seen[-1][1] and AWS_KEY in seen[-1][0]
            assert any(q.get("credential") == "aws" for q in steps(env)[-1]["requests"])
            r = env.run(get.format(url=stub.url_for()))
            assert r.stdout.strip().endswith("403"), r.stdout
            assert not stub.requests
            assert "credential-misuse" in steps(env)[-1]["marks"]
            assert AWS_SECRET not in env.envgit("log", "--json").stdout
        finally:
            env.stop()


# --- sources, read on the host by the daemon ----------------------------------------------


def _command_policy(tmp_path, cmd):
    """A project whose credential `c` is read by `cmd`, loaded as the daemon loads it."""
    from envgit.policy import load_policy
    root = tmp_path / "proj"
    root.mkdir(exist_ok=True)
    (root / "envgit.yaml").write_text("version: 1\ncredentials:\n  c:\n"
                                      f"    from: {{ command: {json.dumps(cmd)} }}\n"
                                      "    hosts: [api.example.test]\n")
    return load_policy(root / "envgit.yaml")


@pytest.mark.sandbox      # a `command:` source runs /bin/sh (in envgit's code: tiers.py does not follow it)
def test_sources_resolve_once_a_session_and_never_say_the_value(tmp_path):
    from envgit.credentials.source import CredentialError, Sources, read
    from envgit.hostcmd import trust
    counter = tmp_path / "ran"
    cmd = f"echo x >> {counter}; printf '%s\\n' {REAL}"
    environ = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    pol = _command_policy(tmp_path, cmd)
    s = Sources(environ)
    with pytest.raises(CredentialError) as e:           # not trusted yet: not run
        s.value("c", {"command": cmd}, pol)
    assert "envgit trust" in str(e.value) and "envgit.yaml:4" in str(e.value)
    assert not counter.exists()
    trust.approve(pol, environ)                         # what `envgit trust --yes` does
    assert s.value("c", {"command": cmd}, pol) == {"token": REAL}
    assert s.value("c", {"command": cmd}, pol) == {"token": REAL}
    assert counter.read_text() == "x\n"               # run once, cached for the session
    assert REAL not in repr(s)
    (tmp_path / "tok").write_text(REAL + "\n")
    assert read("f", {"file": "~/tok"}, {"HOME": str(tmp_path)}) == {"token": REAL}
    failing = _command_policy(tmp_path, "cat ~/tok; exit 3")
    trust.approve(failing, environ)
    for source, words in (({"command": "cat ~/tok; exit 3"}, "exited 3"),     # its output unsaid
                          ({"file": "~/missing"}, "cannot read"),
                          ({"env": "NOPE"}, "NOPE is not set"),
                          ({"profile": "nope"}, "no profile [nope]")):
        with pytest.raises(CredentialError) as e:       # a source the policy does not name is
            read("c", source, environ, failing if "command" in source else None)   # refused under it
        assert words in str(e.value) and REAL not in str(e.value)
    with pytest.raises(CredentialError, match="envgit trust"):
        read("c", {"file": "~/tok"}, environ, failing)


@pytest.mark.sandbox
def test_a_credential_command_runs_from_outside_the_project(tmp_path):
    """cwd /, no project directory on PATH, no loader variables, Python's safe path, and
    none of the caller's other variables: what the command sees is written to a file."""
    from envgit.credentials.source import Sources
    from envgit.hostcmd import trust
    seen = tmp_path / "seen"
    cmd = f"pwd > {seen}; env >> {seen}; printf %s {REAL}"
    pol = _command_policy(tmp_path, cmd)
    project_bin = tmp_path / "proj" / "node_modules" / ".bin"
    project_bin.mkdir(parents=True)
    environ = {"HOME": str(tmp_path), "PATH": f"{project_bin}:.:{os.environ['PATH']}",
               "PYTHONPATH": str(tmp_path / "proj"), "NODE_OPTIONS": "--require ./x.js",
               "NODE_PATH": "node_modules", "LD_PRELOAD": "/proj/x.so", "PYTHONSTARTUP": "x.py",
               "MY_OTHER_TOKEN": "sekret", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    trust.approve(pol, environ)
    assert Sources(environ).value("c", {"command": cmd}, pol) == {"token": REAL}
    cwd, *env = seen.read_text().splitlines()
    got = dict(line.split("=", 1) for line in env if "=" in line)
    assert cwd == "/"
    for name in ("PYTHONPATH", "NODE_OPTIONS", "NODE_PATH", "LD_PRELOAD", "PYTHONSTARTUP",
                 "MY_OTHER_TOKEN"):
        assert name not in got, name
    assert got["PYTHONSAFEPATH"] == "1" and got["HOME"] == str(tmp_path) and got["LC_ALL"] == "C.UTF-8"
    assert str(project_bin) not in got["PATH"].split(":") and "." not in got["PATH"].split(":")


@pytest.mark.parametrize("body, said", [
    ("  gh:\n    from: { env: A, file: b }\n    hosts: [\"github.com\"]\n",
     ":4:11: each entry of credentials.gh.from needs exactly one of"),
    ("  gh:\n    from: { env: A }\n    hosts: [\"http://x\"]\n",
     ":5:13: credentials.gh.hosts[0]: 'http://x' is not a host"),
    ("  gh:\n    from: { env: A }\n", ":4:5: credentials.gh is missing 'hosts'"),
    ("  gh:\n    from: { env: A }\n    hosts: [\"x.test\"]\nenv:\n  pass: [A]\n",
     ":7:1: env.pass names A, the source of credential 'gh'"),
])
def test_bad_credentials_are_refused_with_file_and_line(tmp_path, body, said):
    from envgit.policy import PolicyError, load_policy
    (tmp_path / "envgit.yaml").write_text("version: 1\ncredentials:\n" + body)
    with pytest.raises(PolicyError) as e:
        load_policy(tmp_path / "envgit.yaml")
    assert said in str(e.value), str(e.value)
