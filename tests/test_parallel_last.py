"""Steps that run at once (issue 32, case 4): eight `envgit run` started together in one
project, the one started last ending first. Step numbers follow the starts, snapshots follow
the ends: `last` is the step whose snapshot is newest (the directory as the last step to end
left it), so `ls last`, `restore last` and `rewind last` give every file the eight wrote, and a
daemon started afterwards compares the directory with that tree, not the highest-numbered
step's: nothing a step wrote is recorded as changed outside envgit.

The order is made by marker files, not by sleeps: step i says it has begun (started/i), so the
next one is started only once step i has its number, and writes its file only once the test
creates go/i, which happens in reverse order, each after the previous step's `envgit run`
exited."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from conftest import ENVGIT
from envgit.daemon.client import connect
from envgit.paths import Project
from envgit.sandbox.seccomp import program
from faults.faultlib import no_traceback, tree_of

SHIM = Path(__file__).resolve().parent.parent / "src" / "envgit" / "daemon" / "inner_shim.py"

N = 8
STEP = ("mkdir -p started go && echo 'early {i}' > early{i} && : > started/{i}; "
        "while [ ! -e go/{i} ]; do sleep 0.02; done; echo 'written by step {i}' > file{i}")


def wait_for(path, proc, what):
    t0 = time.monotonic()
    while not path.exists():
        assert proc.poll() is None, f"{what}: exited {proc.returncode}: {proc.communicate()}"
        assert time.monotonic() - t0 < 120, f"{what}: not there after 120 s"
        time.sleep(0.02)


def eight_at_once(proj):
    """Run the eight steps; returns their step numbers in start order."""
    assert proj.run("echo base > base").returncode == 0          # step 1: the baseline is taken
    procs = []
    for i in range(1, N + 1):
        p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", STEP.format(i=i)], cwd=proj.root,
                             env=proj.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        wait_for(proj.root / "started" / str(i), p, f"step of file{i}")
    (proj.root / "go").mkdir(exist_ok=True)
    for i in range(N, 0, -1):                                      # the last started ends first
        (proj.root / "go" / str(i)).write_text("")
        out, err = procs[i - 1].communicate(timeout=120)
        assert procs[i - 1].returncode == 0, err
        no_traceback(subprocess.CompletedProcess([], 0, out, err))
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    ids = [s["id"] for s in log if s["argv"][-1].startswith("mkdir -p started")]
    assert ids == list(range(2, N + 2)), log
    return ids


def files_of(proj, ref):
    r = proj.envgit("ls", ref, "--json", check=True)
    return {e["path"] for e in json.loads(r.stdout)["entries"]}


def test_last_is_the_newest_tree_for_ls_restore_and_rewind(bare_proj, tmp_path):
    proj = bare_proj
    ids = eight_at_once(proj)
    everything = tree_of(proj.root)
    wanted = {f"file{i}" for i in range(1, N + 1)}
    # Each step's own snapshot holds its file (the first to end holds only its own).
    assert "file1" not in files_of(proj, str(ids[-1])) and f"file{N}" in files_of(proj, str(ids[-1]))
    assert wanted <= files_of(proj, str(ids[0]))
    # A snapshot taken while other steps still run holds what they had written by then.
    assert {f"early{i}" for i in range(1, N + 1)} <= files_of(proj, str(ids[-1]))
    # `last` is the newest tree: the directory as the last step to end left it.
    assert wanted <= files_of(proj, "last")
    # `envgit diff` with no steps compares the newest tree with the directory: nothing changed.
    d = json.loads(proj.envgit("diff", "--json", check=True).stdout)
    assert d["changes"] == [], d["changes"][:3]
    shown = json.loads(proj.envgit("show", "last", "--json", check=True).stdout)
    assert shown["id"] == ids[0]
    assert json.loads(proj.envgit("show", "last~1", "--json", check=True).stdout)["id"] == ids[1]
    target = tmp_path / "at-last"
    proj.envgit("restore", "last", "--target", str(target), check=True)
    assert tree_of(target) == everything                          # byte for byte
    r = no_traceback(proj.envgit("rewind", "last", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == everything                       # nothing to bring back
    # `last~1` is the step that ended just before: without file1 (and go/1, made after it).
    r = no_traceback(proj.envgit("rewind", "last~1", "--yes"))
    assert r.returncode == 0, r.stderr
    assert tree_of(proj.root) == {k: v for k, v in everything.items() if k not in ("file1", "go/1")}
    # Its undo point is the newest step itself: no `outside` step is written for it.
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [s["id"] for s in log if "outside" in s["marks"]] == [], log[-2:]
    assert no_traceback(proj.envgit("rewind", "--undo", "--yes")).returncode == 0
    assert tree_of(proj.root) == everything


def test_a_new_daemon_records_no_step_s_file_as_made_outside_envgit(bare_proj):
    proj = bare_proj
    eight_at_once(proj)
    everything = tree_of(proj.root)
    r = proj.envgit("daemon", "stop")
    assert r.returncode == 0, r.stderr
    assert no_traceback(proj.run("true")).returncode == 0          # a new daemon, its first step
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    outside = [s for s in log if "outside" in s["marks"]]
    assert outside == [], outside
    assert log[-1]["argv"][-1] == "true" and log[-1]["snapshot"]["added"] == 0, log[-1]["snapshot"]
    assert tree_of(proj.root) == everything
    # and `envgit rewind last` after the restart still gives back everything
    assert proj.envgit("rewind", "last", "--yes").returncode == 0
    assert tree_of(proj.root) == everything


def test_steps_an_agent_asks_for_at_once_through_the_inner_socket(bare_proj):
    """The same through the session daemon's inner socket, as an agent's parallel tool calls:
    eight shims in the agent's sandbox each ask for a step, the last asked ending first."""
    proj = bare_proj
    assert proj.run("echo base > base").returncode == 0
    conn = connect(Project(str(proj.root)))
    agent = conn.request({"op": "begin", "argv": ["agent"], "cwd": str(proj.root), "env": proj.env,
                          "record_only": True, "session": "agent-par"})
    shutil.copy(SHIM, proj.root / "shim.py")
    fd = os.memfd_create("s", 0)
    os.write(fd, program())
    procs = []
    for i in range(1, N + 1):
        spec = conn.request({"op": "spec", "argv": ["/usr/bin/python3", str(proj.root / "shim.py"), "sh", "-c",
                                                    STEP.format(i=i)],
                             "cwd": str(proj.root), "env": proj.env, "session": "agent-par", "inner": True,
                             "step": agent["step"]})
        os.lseek(fd, 0, 0)
        p = subprocess.Popen([spec["bwrap"][0], "--seccomp", str(fd), *spec["bwrap"][1:]], env=spec["env"],
                             pass_fds=[fd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(p)
        wait_for(proj.root / "started" / str(i), p, f"inner step of file{i}")
    (proj.root / "go").mkdir(exist_ok=True)
    for i in range(N, 0, -1):
        (proj.root / "go" / str(i)).write_text("")
        _, err = procs[i - 1].communicate(timeout=120)
        assert procs[i - 1].returncode == 0, err
    everything = tree_of(proj.root)
    wanted = {f"file{i}" for i in range(1, N + 1)}
    assert wanted <= files_of(proj, "last")
    conn.request({"op": "end", "step": agent["step"], "exit_code": 0})
    assert wanted <= files_of(proj, "last")
    assert proj.envgit("daemon", "stop").returncode == 0
    assert no_traceback(proj.run("true")).returncode == 0
    log = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert [s["id"] for s in log if "outside" in s["marks"]] == [], log[-3:]
    assert tree_of(proj.root) == everything
