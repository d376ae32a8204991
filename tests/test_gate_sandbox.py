"""The network gate as a step meets it: bwrap's loopback-only namespace, the socat bridge,
the daemon's mitmproxy, a real HTTPS git server on 127.0.0.1 and the real git client."""

import json
import os
import shutil
import subprocess

import pytest

from conftest import ENVGIT, Env, make_home
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from kit.person import answer_when_asked
from modelserver import clone_for_push

pytestmark = pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")


def policy(remote, action="deny", extra=""):
    host = remote.url.split("/")[2]
    rule = "" if action == "deny" else f"  - rule: git-push\n    action: {action}\n"
    return (f"version: 1\nnetwork:\n  allow: [\"{host}\"]\nirreversible:\n  - preset: default\n{rule}"
            f"shell: []\n{extra}")


@pytest.fixture
def netproj(tmp_path, remote):
    home = make_home(tmp_path)
    root = home / "app"
    env = Env(home, root, {"ENVGIT_RESOLVE": remote.resolve, "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    clone_for_push(env, remote)          # a clone of the remote, envgit init; its policy below
    env.write_policy(policy(remote))
    yield env
    env.stop()


def steps(proj):
    return json.loads(proj.envgit("log", "--json", check=True).stdout)


def commit(proj, name="greet.js"):
    r = proj.run(f"echo 'console.log(1)' > {name} && git add {name} && git commit -qm {name}")
    assert r.returncode == 0, r.stderr


def test_fetch_goes_through_and_is_recorded(netproj, remote):
    r = netproj.run("git fetch -q origin && git ls-remote origin")
    assert r.returncode == 0, r.stderr
    assert remote.refs()["refs/heads/main"] in r.stdout
    reqs = steps(netproj)[-1]["requests"]
    assert any(q["method"] == "GET" and "info/refs" in q["path"] and q["decision"] == "allow" for q in reqs)
    assert all("service=" not in q["path"] or "service=" in q["path"] for q in reqs)


@pytest.mark.parametrize("cmd", [
    "git push -q origin main",
    "g=git; $g push origin main",
    "git -c http.lowSpeedLimit=1 push origin HEAD:main",
    "printf 'git push origin main\\n' > release.sh && sh release.sh",
])
def test_push_is_denied_at_the_request(netproj, remote, cmd):
    before = remote.refs()
    commit(netproj)
    r = netproj.run(cmd)
    assert r.returncode != 0
    assert "[remote rejected]" in r.stderr and "preset:default/git-push" in r.stderr, r.stderr
    assert "envgit: denied POST" in r.stderr
    assert remote.refs() == before                                   # the server side never changed
    assert not any(m == "POST" and "receive-pack" in p and s == 200 for m, p, s in remote.log)
    s = steps(netproj)[-1]
    assert "denied-net" in s["marks"]
    kinds = {(q["method"], q["decision"]) for q in s["requests"] if "receive-pack" in q["path"]}
    assert ("GET", "allow") in kinds and ("POST", "deny") in kinds


def test_raw_curl_post_to_receive_pack_is_denied(netproj, remote):
    before = remote.refs()
    r = netproj.run(f"curl -s -o /dev/null -w '%{{http_code}}' -X POST --data-binary x {remote.url}/git-receive-pack")
    assert r.stdout.strip() == "403", r.stdout + r.stderr
    assert remote.refs() == before


def test_allowed_push_lands_and_is_marked(netproj, remote):
    netproj.write_policy(policy(remote, "allow"))
    commit(netproj)
    r = netproj.run("git push -q origin main")
    assert r.returncode == 0, r.stderr
    local = subprocess.run(["git", "-C", str(netproj.root), "rev-parse", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
    assert remote.refs()["refs/heads/main"] == local
    s = steps(netproj)[-1]
    assert "irreversible" in s["marks"]
    assert any(q["irreversible"] for q in s["requests"])
    # and a rewind over it warns
    r = netproj.envgit("rewind", "1", "--dry-run")
    assert "a rewind cannot take that back" in r.stdout


@pytest.mark.parametrize("answer,lands", [("approve", True), ("deny", False)])
def test_ask_answered_from_another_terminal(netproj, remote, answer, lands):
    netproj.write_policy(policy(remote, "ask"))
    commit(netproj)
    before = remote.refs()
    t = answer_when_asked(netproj, answer)
    r = netproj.run("git push -q origin main")
    t.join()
    assert (r.returncode == 0) == lands, r.stderr
    assert (remote.refs() != before) == lands
    assert "envgit approve" in r.stderr                        # the step was told how to answer
    s = steps(netproj)[-1]
    assert s["approvals"] and s["approvals"][0]["how"].startswith("envgit " + answer)
    assert len([a for a in s["approvals"]]) == 1               # asked once, not again for the probe


def test_ask_times_out_to_deny(netproj, remote):
    netproj.write_policy(policy(remote, "ask").replace("network:\n", "network:\n  ask_timeout: 1\n"))
    commit(netproj)
    before = remote.refs()
    r = netproj.run("git push -q origin main")
    assert r.returncode != 0 and remote.refs() == before
    s = steps(netproj)[-1]
    assert s["approvals"][0]["who"] == "timeout"


def test_program_ignoring_the_proxy_has_no_network(netproj, remote):
    port = remote.url.split(":")[2].split("/")[0]
    r = netproj.run(f"curl -s --noproxy '*' --max-time 5 https://127.0.0.1:{port}/ ; echo rc=$?")
    assert "rc=7" in r.stdout or "rc=28" in r.stdout, r.stdout


def test_unlisted_host_is_refused(netproj, remote):
    r = netproj.run("curl -s -o /dev/null -w '%{http_code}' https://example.com/")
    assert r.stdout.strip() in ("403", "000"), r.stdout
    s = steps(netproj)[-1]
    assert any(q["decision"] == "deny" for q in s["requests"]) or r.stdout.strip() == "000"


PY = "/usr/bin/python3"


def test_no_direct_tcp_udp_dns_or_ipv6(netproj, remote):
    port = remote.url.split(":")[2].split("/")[0]
    code = f"""
import socket
out = []
for fam, addr in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET6, ("::1", {port})),
                  (socket.AF_INET, ("1.1.1.1", 443))):
    try:
        s = socket.socket(fam); s.settimeout(3); s.connect(addr); out.append("tcp-open")
    except OSError as e:
        out.append("tcp-" + type(e).__name__)
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
    u.sendto(b"x", ("8.8.8.8", 53)); u.recv(10); out.append("udp-open")
except OSError as e:
    out.append("udp-" + type(e).__name__)
try:
    socket.getaddrinfo("example.com", 443); out.append("dns-open")
except OSError as e:
    out.append("dns-" + type(e).__name__)
print(" ".join(out))
"""
    r = netproj.envgit("run", "--", PY, "-c", code)
    assert "open" not in r.stdout and r.stdout.count("-") == 5, r.stdout + r.stderr


def test_ssh_remote_is_refused_with_a_hint(netproj):
    r = netproj.run("curl -s -x \"$HTTPS_PROXY\" -p telnet://github.com:22 --max-time 5 ; echo rc=$?")
    s = steps(netproj)[-1]
    assert "rc=0" not in r.stdout
    assert any(q.get("port") == 22 and q["decision"] == "deny" for q in s["requests"]), s["requests"]


def test_ask_answered_at_the_terminal_of_envgit_run(netproj, remote):
    netproj.write_policy(policy(remote, "ask"))
    commit(netproj)
    before = remote.refs()
    status, out = netproj.pty_run(["git", "push", "-q", "origin", "main"], send=b"y\n", when=b"deny [N]?",
                                  timeout=60)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert "refs/heads/main" in out                       # the question showed the ref update
    assert remote.refs() != before
    s = steps(netproj)[-1]
    assert s["approvals"][0]["how"] == "at the terminal of envgit run"


def test_a_steps_credentials_do_not_work_from_another_sandbox(netproj, remote):
    """A running step leaves its proxy credentials in the project; another step that uses
    them is refused (they are tied to the first step's sandbox), and nothing is recorded on
    the first step in its name."""
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", 'echo "$HTTPS_PROXY" > creds.txt; echo ready; sleep 8'],
                         cwd=netproj.root, env=netproj.env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    r = netproj.run('P=$(cat creds.txt); HTTPS_PROXY=$P https_proxy=$P git ls-remote origin; echo rc=$?')
    p.kill()
    p.wait()
    assert "rc=0" not in r.stdout, r.stdout + r.stderr
    first, second = steps(netproj)[-2:]
    assert first["requests"] == [], first["requests"]
    # its own credentials still work
    assert netproj.run("git ls-remote -q origin").returncode == 0
