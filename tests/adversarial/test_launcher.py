"""Classes 3 and 13: how a sandbox starts.

Class 3: bwrap (and socat, the in-sandbox network bridge) are never looked up on PATH, where
a project's activated virtualenv puts a directory every step can write: a step that plants
`.venv/bin/bwrap` must not get it run outside by the next `envgit run`.

Class 13: one launcher for every sandbox, and a step's proxy credentials work only from the
sandbox they were issued to: a step run through the inner socket (an agent's Bash call) gets
credentials tied to its own sandbox, and the gate refuses a credential from anywhere else
(another process outside, another step's sandbox).

Oracles: marker files a planted binary would write; the gate's 407 (credentials refused)
against any other answer (credentials accepted, request judged)."""

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SHIM = Path(__file__).resolve().parents[2] / "src" / "envgit" / "daemon" / "inner_shim.py"
NETWORK = "version: 1\nnetwork:\n  allow: [example.com]\n"
FAKE = "#!/bin/sh\ntouch {marker}\nexec /usr/bin/{name} \"$@\"\n"


def plant(attacker, name, marker):
    """What a step does: a fake `name` in the project's virtualenv, which writes `marker`."""
    r = attacker.run(f"mkdir -p .venv/bin && printf '%s' '{FAKE.format(marker=marker, name=name)}' "
                     f"> .venv/bin/{name} && chmod +x .venv/bin/{name}")
    assert r.returncode == 0, r.stderr
    assert (attacker.root / ".venv" / "bin" / name).exists()


def test_a_planted_bwrap_on_path_is_not_run(attacker):
    marker = attacker.home / "bwrap-ran"          # outside the project: only a host run writes it
    plant(attacker, "bwrap", marker)
    venv_path = f"{attacker.root}/.venv/bin:{attacker.env['PATH']}"      # the venv is active
    r = attacker.run("echo still-sandboxed; cat ~/.ssh/id_ed25519", env={"PATH": venv_path})
    assert not marker.exists(), "the planted bwrap ran outside the sandbox"
    assert "still-sandboxed" in r.stdout and "CANARY" not in r.stdout, r.stderr
    doctor = attacker.envgit("doctor", env={"PATH": venv_path})          # runs bwrap outside too
    assert not marker.exists(), "envgit doctor ran the planted bwrap"
    assert "/usr/bin/bwrap" in doctor.stdout or "/bin/bwrap" in doctor.stdout, doctor.stdout


def test_a_planted_socat_is_not_the_bridge(attacker):
    marker = attacker.root / "socat-ran"          # the bridge runs inside: the project is writable
    plant(attacker, "socat", marker)
    attacker.write_policy(NETWORK)
    venv_path = f"{attacker.root}/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    r = attacker.run("echo bridged", env={"PATH": venv_path})
    assert r.returncode == 0 and "bridged" in r.stdout, r.stderr
    assert not marker.exists(), "the step's socat served the network bridge"


@pytest.mark.both_uids("ENVGIT_BWRAP is trusted by its owner, root or the uid running envgit (launch.py _usable): a "
                       "non-root person owns the planted file too, so only the inside-the-project refusal stops it")
def test_envgit_bwrap_inside_the_project_is_refused(attacker):
    """ENVGIT_BWRAP names another bwrap; one inside the project (which a step can rewrite) is
    refused, with a clear message."""
    marker = attacker.home / "bwrap-ran"
    plant(attacker, "bwrap", marker)
    r = attacker.run("echo x", env={"ENVGIT_BWRAP": str(attacker.root / ".venv" / "bin" / "bwrap")})
    assert r.returncode != 0 and "inside the project" in r.stderr, r.stderr
    assert not marker.exists()
    ok = attacker.run("echo ok", env={"ENVGIT_BWRAP": "/usr/bin/bwrap"})
    assert ok.returncode == 0 and ok.stdout == "ok\n", ok.stderr


PROBE = ("code=$(curl -s -o /dev/null -w '%{{http_code}}' -x \"$HTTP_PROXY\" http://example.com/); "
         "echo \"code=$code\"; printf '%s' \"$HTTP_PROXY\" > cred; {rest}")


def _proxy_status(sock_path, cred):
    """A plain-HTTP proxy request with `cred` on the gate's unix socket, from this process."""
    import base64
    token = base64.b64encode(cred.encode()).decode()
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(20)
    s.connect(sock_path)
    s.sendall(f"GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: Basic {token}\r\n"
              "Connection: close\r\n\r\n".encode())
    data = b""
    while b"\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return int(data.split()[1]) if data.startswith(b"HTTP/") else None


def _inner(attacker, session):
    from envgit.daemon.client import connect
    from envgit.paths import Project
    attacker.run("true")
    conn = connect(Project(str(attacker.root)), start=False)
    reply = conn.request({"op": "spec", "argv": ["true"], "cwd": str(attacker.root), "env": {},
                          "session": session, "inner": True})
    assert "bwrap" in reply, reply
    shim = attacker.home / "inner_shim.py"
    shutil.copy(SHIM, shim)
    attacker.own(shim)
    bound = reply["bwrap"][reply["bwrap"].index("/run/envgit/control.sock") - 1]
    return shim, Path(bound)        # (a long path is made in a private temp dir instead)


TIED_BY_PEER = ("the gate ties a credential to its sandbox by the peer's process (SO_PEERCRED and /proc/PID), which "
                "the kernel shows a non-root daemon only for that uid's own processes: a credential used from "
                "anywhere else must be refused for both")


@pytest.mark.both_uids(TIED_BY_PEER)
def test_an_inner_step_gets_tied_credentials_and_nobody_else_can_use_them(attacker):
    if shutil.which("curl") is None:
        import pytest
        pytest.skip("curl is needed inside the sandbox")
    attacker.write_policy(NETWORK)
    shim, sock = _inner(attacker, "agent-cred")
    cred_file = attacker.root / "cred"
    # the inner step: uses its own credentials (judged, not 407), leaves them in the project,
    # and stays alive while they are tried from elsewhere
    p = subprocess.Popen(attacker._argv([sys.executable, str(shim), "sh", "-c",
                                         PROBE.format(rest="sleep 8")]),
                         cwd=attacker.root, env={**attacker.env, "ENVGIT_INNER_SOCKET": str(sock)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (cred_file.exists() and cred_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not cred_file.exists():
            p.kill()
            raise AssertionError("the inner step did not run: " + "\n".join(p.communicate()))
        cred = cred_file.read_text().split("//", 1)[1].rsplit("@", 1)[0]
        gate = str(attacker.root / ".envgit" / "net" / "proxy.sock")
        # from a process outside any sandbox: refused
        assert _proxy_status(gate, cred) == 407
        # from another step's sandbox: refused
        other = attacker.run(f"curl -s -o /dev/null -w 'other=%{{http_code}}' -x 'http://{cred}@127.0.0.1:3128' "
                             "http://example.com/")
        assert "other=407" in other.stdout, other.stdout + other.stderr
    finally:
        out, err = p.communicate(timeout=60)
    assert "code=" in out and "code=407" not in out, out + err         # its own: accepted


@pytest.mark.both_uids(TIED_BY_PEER)
def test_an_envgit_run_step_credentials_are_tied_too(attacker):
    if shutil.which("curl") is None:
        import pytest
        pytest.skip("curl is needed inside the sandbox")
    attacker.write_policy(NETWORK)
    r = attacker.run(PROBE.format(rest="true"))
    assert "code=" in r.stdout and "code=407" not in r.stdout, r.stdout + r.stderr
    cred = (attacker.root / "cred").read_text().split("//", 1)[1].rsplit("@", 1)[0]
    # the step has ended: its credentials are gone, from anywhere
    gate = str(attacker.root / ".envgit" / "net" / "proxy.sock")
    assert _proxy_status(gate, cred) == 407


def test_the_repl_and_inner_steps_start_through_the_launcher():
    """Structural: no module but the launcher builds a bwrap start (seccomp, info/block fds)."""
    src = Path(__file__).resolve().parents[2] / "src" / "envgit"
    starters = []
    for f in src.rglob("*.py"):
        if f.name == "landlock_run.py":   # bwrap's stand-in on a Landlock host: it takes these
            continue                      # options from the launcher, as bwrap does
        text = f.read_text()
        if '"--seccomp"' in text or '"--block-fd"' in text or "memfd_create(" in text:
            starters.append(f.relative_to(src).as_posix())
    assert starters == ["sandbox/launch.py"], starters


def test_an_agent_binary_planted_in_the_project_is_not_launched(attacker):
    """`envgit codex` runs Codex itself outside the sandbox: one found inside the project (a
    step's `.venv/bin/codex` on an activated PATH) is refused."""
    marker = attacker.home / "codex-ran"
    r = attacker.run(f"mkdir -p .venv/bin && printf '#!/bin/sh\\ntouch {marker}\\n' > .venv/bin/codex "
                     "&& chmod +x .venv/bin/codex")
    assert r.returncode == 0, r.stderr
    venv_path = f"{attacker.root}/.venv/bin:{attacker.env['PATH']}"
    out = attacker.envgit("codex", "exec", "hi", env={"PATH": venv_path}, timeout=60)
    assert not marker.exists(), "the planted codex ran"
    assert out.returncode != 0 and "inside the project" in out.stderr, out.stderr
