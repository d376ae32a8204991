"""The network in daily use (issue 12 §4): a step that tries to reach a host the policy does not
allow fails at once, the names it looked up are recorded on the step, and envgit says once,
after the step, which hosts, where network.allow is (file:line) and the exact line to add.

Real clients in real steps: npm, pip, curl, git and Python's urllib. The offline cases need no
server: the hosts are `.invalid` names, which must never resolve anywhere (RFC 6761), or the
real registries' names, which a step with no network cannot reach at all (its namespace has
loopback only, and its resolver answers every name "does not exist"). With the network on, the
gate runs and denies; no request leaves this machine.
"""

import json
import re
import shutil
import time

import pytest

POLICY_FLOW = 'version: 1\nnetwork:\n  allow: []\n'              # allow: is line 3
POLICY_BLOCK = 'version: 1\nnetwork:\n  allow:\n    - "example.test"\n'


def notices(stderr, step=None):
    """The `tried to reach` notices envgit printed (of `step`, if given)."""
    pat = rf"^envgit: step {step if step is not None else r'\d+'}: tried to reach .*$"
    return re.findall(pat, stderr, re.M)


def step_json(proj, ref="last"):
    r = proj.envgit("show", ref, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def timed(proj, script, **kw):
    t = time.monotonic()
    r = proj.run(script, **kw)
    return r, time.monotonic() - t


def apply_fix(text: str, notice: str) -> str:
    """The policy after doing what the notice says (the 'make line N read' and 'add this line
    after line N' forms), to check that the line it gives is the exact line."""
    lines = text.splitlines()
    m = re.search(r"make line (\d+) read: `(.*?)`", notice)
    if m:
        lines[int(m.group(1)) - 1] = m.group(2)
        return "\n".join(lines) + "\n"
    m = re.search(r"add this line after line (\d+): `(.*?)`", notice)
    assert m, notice
    lines.insert(int(m.group(1)), m.group(2))
    return "\n".join(lines) + "\n"


# --- offline: no host in network.allow ---------------------------------------------------

CLIENTS = {
    # name: (script, the host it looks up, how long it may take at most)
    "curl": ("curl -sS https://curl.never.invalid/", "curl.never.invalid", 15),
    "git": ("git ls-remote https://git.never.invalid/x.git", "git.never.invalid", 15),
    "urllib": ("python3 -c 'import urllib.request; urllib.request.urlopen(\"https://py.never.invalid/\")'",
               "py.never.invalid", 15),
    "pip": ("python3 -m pip download --no-cache-dir --no-deps -d /tmp/dl "
            "--index-url https://pypi.never.invalid/simple requests", "pypi.never.invalid", 40),
    "npm": ("cd /tmp && npm install --no-audit --no-fund --registry https://npm.never.invalid/ left-pad",
            "npm.never.invalid", 40),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_client_fails_at_once_and_the_host_is_named_once(proj, client):
    script, host, bound = CLIENTS[client]
    if shutil.which(script.split()[0] if client != "npm" else "npm") is None:
        pytest.skip(f"{client} is not installed")
    proj.write_policy(POLICY_FLOW)
    r, took = timed(proj, script, timeout=180)
    assert r.returncode != 0, r.stdout + r.stderr
    # before: npm retried "host not found" for 70 s a request, pip 5 times with back-off
    assert took < bound, (took, r.stderr[-2000:])
    assert "Retrying" not in r.stderr, r.stderr           # pip's retry warnings
    said = notices(r.stderr)
    assert len(said) == 1, r.stderr
    assert host in said[0] and "not in network.allow (envgit.yaml:3)" in said[0], said
    fixed = apply_fix(POLICY_FLOW, said[0])
    assert f'"{host}"' in fixed.splitlines()[2], fixed
    s = step_json(proj)
    assert host in s["dns_names"] and s["dns_queries"] >= 1, s
    assert "denied-net" in s["marks"]
    shown = proj.envgit("show", "last").stdout
    assert "looked up" in shown and host in shown, shown


def test_the_fix_line_is_exact_in_a_block_list_and_allows_the_host(proj):
    from envgit.policy import load_policy
    proj.write_policy(POLICY_BLOCK)
    (proj.root / "unused").write_text("")
    r = proj.run("curl -sS https://block.never.invalid/; curl -sS https://block.never.invalid/x")
    said = notices(r.stderr)
    assert len(said) == 1, r.stderr                       # two tries of one host: said once
    assert "(envgit.yaml:3)" in said[0] and 'after line 4: `    - "block.never.invalid"`' in said[0], said
    fixed = apply_fix(POLICY_BLOCK, said[0])
    path = proj.root / "fixed.yaml"
    path.write_text(fixed)
    assert "block.never.invalid" in load_policy(path).network_allow


def test_a_registry_host_is_answered_with_its_preset(proj):
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    proj.write_policy(POLICY_FLOW)
    # the real default registry: unreachable from a step with no network, looked up only
    r, took = timed(proj, "cd /tmp && npm install --no-audit --no-fund left-pad", timeout=180)
    assert r.returncode != 0 and took < 40, (took, r.stderr[-2000:])
    said = notices(r.stderr)
    assert len(said) == 1 and "registry.npmjs.org" in said[0], r.stderr
    assert 'make line 3 read: `  allow: ["preset:npm"]`' in said[0], said
    assert "registry.npmjs.org" in step_json(proj)["dns_names"]


def test_no_lookup_no_notice(proj):
    proj.write_policy(POLICY_FLOW)
    r = proj.run("cat envgit.yaml >/dev/null; echo fine")
    assert r.returncode == 0 and r.stdout == "fine\n", r.stderr
    assert not notices(r.stderr), r.stderr
    s = step_json(proj)
    assert s["dns_names"] == [] and s["dns_queries"] is None and "denied-net" not in s["marks"]


def test_lookups_fail_as_not_found_not_as_try_again(proj):
    # "does not exist" (EAI_NONAME), not "temporary failure" (EAI_AGAIN), which clients retry
    r = proj.run("python3 -c 'import socket\ntry:\n socket.getaddrinfo(\"a.never.invalid\", 80)\n"
                 "except socket.gaierror as e: print(e.errno == socket.EAI_NONAME)'")
    assert r.stdout == "True\n", r.stdout + r.stderr


def test_the_sandbox_resolver_is_the_only_nameserver(proj):
    r = proj.run("grep '^nameserver' /etc/resolv.conf")
    assert r.stdout == "nameserver 127.0.0.1\n", r.stdout + r.stderr


# --- on a real terminal ------------------------------------------------------------------

@pytest.mark.parametrize("net", ["off", "on"])
def test_on_a_terminal_the_notice_is_said_once(proj, net):
    if net == "on" and shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    proj.write_policy(POLICY_FLOW if net == "off" else 'version: 1\nnetwork:\n  allow: ["example.test"]\n')
    # a name typed at the terminal, looked up twice by the program (a retry), then curl
    status, out = proj.pty_run(
        ["sh", "-c", "read -r host; for i in 1 2; do getent hosts \"$host\"; done; "
                     "curl -sS --noproxy '*' \"https://$host/\"; echo done-$?"],
        send=b"typed.never.invalid\r", when=b"", timeout=60)
    assert "done-6" in out, out                         # curl: could not resolve host
    assert out.count("typed.never.invalid, not in network.allow (envgit.yaml:3)") == 1, out
    assert "typed.never.invalid" in step_json(proj)["dns_names"]


# --- with hosts allowed: the gate's denials, once a step --------------------------------

def test_a_denied_host_is_said_once_however_often_the_client_retries(proj):
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    policy = 'version: 1\nnetwork:\n  allow: ["example.test"]\n'
    proj.write_policy(policy)
    # pip retries a failed connection 5 times (PIP_RETRIES is not set with the network on)
    r = proj.run("for i in 1 2 3; do curl -sS -o /dev/null https://denied.never.invalid/; done; "
                 "python3 -m pip download --no-cache-dir --no-deps -d /tmp/dl --retries 3 "
                 "--index-url https://denied.never.invalid/simple requests >/dev/null 2>&1; echo end",
                 timeout=180)
    assert r.stdout.endswith("end\n"), r.stdout + r.stderr
    said = [line for line in r.stderr.splitlines() if "denied.never.invalid" in line and line.startswith("envgit:")]
    assert len(said) == 1, r.stderr
    assert "not in network.allow (envgit.yaml:3)" in said[0]
    assert 'make line 3 read: `  allow: ["example.test", "denied.never.invalid"]`' in said[0], said
    s = step_json(proj)
    assert sum(1 for q in s["requests"] if q["host"] == "denied.never.invalid") >= 4, s["requests"]


def test_a_lookup_that_bypasses_the_proxy_is_said(proj):
    if shutil.which("socat") is None:
        pytest.skip("socat is not installed (dev/run installs it)")
    proj.write_policy('version: 1\nnetwork:\n  allow: ["example.test"]\n')
    r = proj.run("curl -sS --noproxy '*' https://example.test/; echo rc=$?")
    assert "rc=6" in r.stdout, r.stdout + r.stderr
    said = [line for line in r.stderr.splitlines() if "example.test" in line and line.startswith("envgit:")]
    assert len(said) == 1 and "itself instead of going through envgit's proxy" in said[0], r.stderr


# --- socat missing: envgit's own failure, at once ------------------------------------------

@pytest.mark.parametrize("socat", ["/nonexistent/socat", "/bin/false"])
def test_a_missing_socat_is_found_at_once(proj, socat):
    proj.write_policy('version: 1\nnetwork:\n  allow: ["example.test"]\n')
    proj.stop()
    # the daemon (which reads ENVGIT_SOCAT) started first, outside the time taken: on a loaded
    # machine its start and the gate's came near the bound alone
    proj.envgit("daemon", "status", env={"ENVGIT_SOCAT": socat}, check=True)
    t = time.monotonic()
    r = proj.envgit("run", "--", "echo", "ran", env={"ENVGIT_SOCAT": socat})
    took = time.monotonic() - t
    assert r.returncode == 125 and "ran" not in r.stdout, r.stdout + r.stderr
    assert "apt-get install socat" in r.stderr, r.stderr
    # the gate's start dominates; the bridge loop alone took 20 s
    assert took < 15, took
    proj.stop()


# --- a step the daemon runs (an agent's Bash call through the inner socket) --------------

def test_a_step_asked_for_from_inside_gets_the_resolver_too(proj):
    import os
    import subprocess
    from pathlib import Path

    from envgit.daemon.client import connect
    from envgit.paths import Project
    from envgit.sandbox.seccomp import program
    proj.write_policy(POLICY_FLOW)
    proj.run("true")
    conn = connect(Project(str(proj.root)))
    helper = conn.request({"op": "begin", "argv": ["agent"], "cwd": str(proj.root), "env": proj.env,
                           "record_only": True, "session": "agent-dns"})
    shim = Path(__file__).resolve().parent.parent / "src" / "envgit" / "daemon" / "inner_shim.py"
    shutil.copy(shim, proj.root / "shim.py")
    spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", str(proj.root / "shim.py"), "sh", "-c",
                                                "getent hosts inner.never.invalid; echo rc=$?"],
                         "cwd": str(proj.root), "env": proj.env, "session": "agent-dns", "inner": True,
                         "step": helper["step"]})
    fd = os.memfd_create("s", 0)
    os.write(fd, program())
    os.lseek(fd, 0, 0)
    t = time.monotonic()
    r = subprocess.run([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                       pass_fds=[fd], capture_output=True, text=True, timeout=60)
    assert "rc=2" in r.stdout and time.monotonic() - t < 20, r.stdout + r.stderr   # not found, at once
    assert len(notices(r.stderr)) == 1 and "inner.never.invalid" in r.stderr, r.stderr
    conn.request({"op": "end", "step": helper["step"], "exit_code": 0})
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    inner = [s for s in steps if s["session"] == "agent-dns" and s["argv"][:1] == ["sh"]]
    assert len(inner) == 1 and inner[0]["dns_names"] == ["inner.never.invalid"], inner
