"""Ports a step publishes (`envgit run -p`, sandbox/publish.py, daemon/publish.py): a server
the step starts is reached by the person at the host's 127.0.0.1 while the step runs, and not
after; with the network on (network.allow and its bridge) beside it; `envgit ps` lists it;
what cannot be published is said before anything runs and no step is recorded for it."""

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request

from conftest import ENVGIT
from kit.ports import free_port as _free_port
from test_daily_network import DevServer, project

PY = "python3"


def _start(env, argv):
    """`envgit run ARGV…` in the background, as a person starts a dev server."""
    return subprocess.Popen([ENVGIT, "run", *argv], cwd=env.root, env=env.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _get(port, path="/hello.txt", tries=None, within_s=60):
    """The body at http://127.0.0.1:PORT/PATH, retried while the server inside starts (for a
    minute, or `tries` times); None if it never answers. A minute: the step starts a new
    project's daemon, its gate and a Python server, which the ten seconds of 100 tries did not
    always see through on a loaded machine."""
    deadline = time.monotonic() + within_s
    n = 0
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.read().decode()
        except (urllib.error.URLError, ConnectionError, OSError):
            n += 1
            if (tries is not None and n >= tries) or time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def _steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def test_the_person_opens_a_server_the_step_started_while_it_runs_and_not_after(tmp_path):
    with DevServer() as dev:
        # the network on: a loopback host allowed for outbound beside the published port
        env = project(tmp_path, policy=f'version: 1\nnetwork:\n  allow: ["127.0.0.1:{dev.port}"]\n')
        (env.root / "hello.txt").write_text("served from inside the step\n")
        port, v6 = _free_port(), _free_port()
        try:
            p = _start(env, ["-p", str(port), "--", "sh", "-c",
                             f"curl -sS http://127.0.0.1:{dev.port}/out >/dev/null && "
                             f"exec {PY} -m http.server {port} --bind 127.0.0.1"])
            assert _get(port) == "served from inside the step\n"
            listed = json.loads(env.envgit("ps", "--json", check=True).stdout)["steps"]
            assert [s["published"] for s in listed] == [[[port, port]]], listed
            assert f"http://127.0.0.1:{port}/" in env.envgit("ps", check=True).stdout
            # a server listening on ::1 only (a dev server bound to `localhost`), at another host port
            q = _start(env, ["-p", f"{v6}:{port + 1 if port < 65535 else port - 1}", "--", PY, "-m",
                             "http.server", str(port + 1 if port < 65535 else port - 1), "--bind", "::1"])
            assert _get(v6) == "served from inside the step\n"
            said = []
            for proc in (p, q):
                proc.terminate()
                said.append(proc.communicate(timeout=30)[1])
            assert f"port {port} published at http://127.0.0.1:{port}/" in said[0], said
            assert dev.hits == ["/out"]                     # outbound to the allowed host still works
            assert _get(port, tries=3) is None and _get(v6, tries=3) is None     # closed with the step
            assert env.envgit("ps", check=True).stdout.strip() == "no step is running"
            first = [s for s in _steps(env) if s["argv"][:1] == ["sh"]][0]
        finally:
            env.stop()
        assert first["published"] == [[port, port]]


def test_what_cannot_be_published_is_said_before_anything_runs(tmp_path):
    with DevServer() as dev:
        env = project(tmp_path, policy=f'version: 1\nnetwork:\n  allow: ["localhost:{dev.port}"]\n')
        taken = socket.socket()
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        try:
            cases = {
                str(dev.port): "both published and in network.allow",
                f"{taken.getsockname()[1]}:8080": "another program listens there",
                "80": "cannot listen on port 80",
                "web": "is not a port to publish",
            }
            for value, said in cases.items():
                r = env.envgit("run", "-p", value, "--", "touch", "ran")
                assert r.returncode == 125 and said in r.stderr, (value, r.stderr)
                assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
            assert not (env.root / "ran").exists()
            assert _steps(env) == []                        # nothing recorded for what did not run
            r = env.envgit("run", "-p")
            assert r.returncode == 2 and "needs a port" in r.stderr
        finally:
            taken.close()
            env.stop()


def test_a_port_the_policy_publishes_is_published_for_every_step(tmp_path):
    port = _free_port()
    env = project(tmp_path, policy=f"version: 1\nnetwork:\n  publish: [{port}]\n")
    (env.root / "hello.txt").write_text("from the policy's port\n")
    try:
        p = _start(env, ["--", PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
        assert _get(port) == "from the policy's port\n"
        p.terminate()
        p.communicate(timeout=30)
        assert _get(port, tries=3) is None
    finally:
        env.stop()
    env.write_policy('version: 1\nnetwork:\n  publish: [80, "web"]\n')
    r = env.envgit("policy", "check")
    assert r.returncode == 2 and "envgit.yaml:3" in r.stderr and "cannot listen on port 80" in r.stderr, r.stderr
    assert "is not a port to publish" in r.stderr, r.stderr       # every error, each with its line


def test_the_policys_port_held_by_a_running_step_leaves_the_other_steps_running(tmp_path):
    """network.publish is every step's: while the dev server's step holds the port, the
    project's other steps run (without it); a port another program holds is said, not a
    failure; a port asked for with -p that cannot be had still is one."""
    port, other = _free_port(), _free_port()
    env = project(tmp_path, policy=f"version: 1\nnetwork:\n  publish: [{port}, {other}]\n")
    (env.root / "hello.txt").write_text("still served\n")
    taken = socket.socket()
    taken.bind(("127.0.0.1", other))
    taken.listen()
    try:
        p = _start(env, ["--", PY, "-m", "http.server", str(port), "--bind", "127.0.0.1"])
        assert _get(port) == "still served\n"
        r = env.run("echo another step")
        assert r.returncode == 0 and "another step" in r.stdout, r.stderr
        assert f"port {other} is not published" in r.stderr and "another program listens there" in r.stderr
        assert _get(port) == "still served\n"            # the dev server's step keeps its port
        r = env.envgit("run", "-p", str(port), "--", "true")
        assert r.returncode == 125 and "still running, publishes it" in r.stderr, r.stderr
        p.terminate()
        p.communicate(timeout=30)
    finally:
        taken.close()
        env.stop()
