"""A CLI and a session daemon of two builds (an upgrade while a daemon still runs): the
protocol number in `hello` tells them apart. The older build is the real one, taken from this
repository's history (the commit before the protocol number existed) and run from its own
source tree; its daemon and its client are real processes speaking on the real socket.

Oracles: exit codes, stderr having no traceback, which pid answers afterwards, and the bytes a
step wrote."""

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from envgit.daemon.client import PROTOCOL

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def old_build(tmp_path_factory):
    """The source tree of the last commit whose daemon says no protocol in its hello."""
    git = ["git", "-C", str(REPO)]
    added = subprocess.run([*git, "log", "--format=%H", "-S", "PROTOCOL = 1", "--",
                            "src/envgit/daemon/client.py"], capture_output=True, text=True)
    if added.returncode != 0 or not added.stdout.split():
        pytest.fail("this test needs the repository's history (a clone, not an export): "
                    + added.stderr)
    old = added.stdout.split()[-1] + "^"
    tree = subprocess.run([*git, "archive", "--format=tar", old, "src/envgit"],
                          capture_output=True, check=True).stdout
    dest = tmp_path_factory.mktemp("old-build")
    with tarfile.open(fileobj=io.BytesIO(tree)) as t:
        t.extractall(dest, filter="data")
    src = dest / "src"
    assert "PROTOCOL" not in (src / "envgit" / "daemon" / "client.py").read_text()
    return src


def old_envgit(proj, old_src, *args, timeout=60):
    """The old build's CLI (and any daemon it starts: PYTHONPATH reaches it)."""
    code = "import sys; from envgit.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=proj.root,
                          env={**proj.env, "PYTHONPATH": str(old_src)},
                          capture_output=True, text=True, timeout=timeout)


def daemon_source(pid) -> str:
    """Which tree the daemon with this pid imports envgit from (its PYTHONPATH)."""
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((e.decode().split("=", 1)[1] for e in env if e.startswith(b"PYTHONPATH=")), "")


def status(proj):
    r = proj.envgit("daemon", "status", check=True)
    return json.loads(r.stdout)


def test_a_new_command_stops_an_idle_daemon_of_the_older_build_and_goes_on(proj, old_build):
    r = old_envgit(proj, old_build, "daemon", "status")
    assert r.returncode == 0, r.stderr
    old_pid = json.loads(r.stdout)["pid"]
    assert daemon_source(old_pid) == str(old_build)
    for text in ("one", "two"):                       # two steps the old build's daemon records
        r = old_envgit(proj, old_build, "run", "--", "sh", "-c", f"echo {text} > f")
        assert r.returncode == 0, r.stderr
    # a rewind and its undo: the two ops whose replies changed shape since that build
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode == 0, r.stderr
    assert (proj.root / "f").read_text() == "one\n"
    assert "Traceback" not in r.stderr
    assert "another build of envgit" in r.stderr and "stopped it" in r.stderr
    assert not os.path.exists(f"/proc/{old_pid}") or "zombie" in Path(f"/proc/{old_pid}/status").read_text()
    s = status(proj)
    assert s["pid"] != old_pid and s["protocol"] == PROTOCOL
    r = proj.envgit("rewind", "--undo", "--yes")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (proj.root / "f").read_text() == "two\n"


def test_a_daemon_of_the_older_build_running_a_step_is_left_alone_and_said(proj, old_build):
    marker = proj.root / "old-step-done"
    # the old step runs until the test makes `go`: a `sleep 4` could end before the newer
    # build's `envgit run` below reached the daemon on a loaded machine (idle: replaced)
    old = subprocess.Popen([sys.executable, "-c", "import sys; from envgit.cli import main; sys.exit(main())",
                            "run", "--", "sh", "-c", "i=0; while [ ! -e go ] && [ $i -lt 600 ]; do sleep 0.1; "
                            f"i=$((i+1)); done; echo done > {marker.name}"],
                           cwd=proj.root, env={**proj.env, "PYTHONPATH": str(old_build)},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:            # until the old daemon holds the step
        r = old_envgit(proj, old_build, "daemon", "status")
        if r.returncode == 0 and json.loads(r.stdout)["live"]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the old build's step never started")
    old_pid = json.loads(r.stdout)["pid"]
    r = proj.envgit("run", "--", "true")
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("envgit: "), r.stderr
    assert "another build" in r.stderr and "still run" in r.stderr and "envgit daemon stop" in r.stderr
    (proj.root / "go").touch()
    _, err = old.communicate(timeout=60)
    assert old.returncode == 0, err                   # the old build's step ran to its end
    assert marker.read_text() == "done\n"
    assert os.path.exists(f"/proc/{old_pid}")         # and its daemon was not stopped under it
    r = proj.envgit("run", "--", "true")               # idle now: replaced, and the step runs
    assert r.returncode == 0 and "stopped it" in r.stderr, r.stderr


def test_a_command_of_the_older_build_gets_one_line_from_a_newer_daemon(proj, old_build):
    pid = status(proj)["pid"]
    r = old_envgit(proj, old_build, "run", "--", "sh", "-c", "echo x > from-old")
    assert r.returncode != 0 and not (proj.root / "from-old").exists()
    assert "Traceback" not in r.stderr and "another build of envgit" in r.stderr, r.stderr
    assert "envgit daemon stop" in r.stderr
    # the older build can still stop it, and then runs with a daemon of its own
    r = old_envgit(proj, old_build, "daemon", "stop")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 15
    while os.path.exists(f"/proc/{pid}") and "zombie" not in Path(f"/proc/{pid}/status").read_text() \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    r = old_envgit(proj, old_build, "run", "--", "sh", "-c", "echo x > from-old")
    assert r.returncode == 0, r.stderr
    assert (proj.root / "from-old").read_text() == "x\n"
