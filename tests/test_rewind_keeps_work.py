"""A rewind never loses a person's work (issue 12, section 3), through the real CLI, daemon,
bwrap and git.

- Changes made outside envgit between two steps (the person's editor, their own `git commit`)
  are recorded as a step of their own (`outside`, with the paths) before the next step starts,
  never charged to it, and shown as such by log, show and diff.
- Every rewind first records an undo point: `envgit rewind --undo`, or rewinding to the step
  the rewind prints, gives back the exact tree (bytes, modes, symlinks, deletions, `.git`),
  outside edits included.
- `envgit.yaml` is the person's: a rewind leaves it as it is unless `--policy` is given.
- A rewind of many files shows progress on a terminal (quiet when piped), and its plan is a
  summary by top directory.
"""

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time

import pytest

from conftest import ENVGIT
from faults.faultlib import tree_of


def git(proj, *args):
    return subprocess.run(["git", "-C", str(proj.root), *args], capture_output=True, text=True)


def person_commits(proj, path, text):
    """The person, in their own terminal: an edit and a commit with the real git."""
    (proj.root / path).write_text(text)
    assert git(proj, "add", path).returncode == 0
    r = git(proj, "-c", "user.email=p@example.test", "-c", "user.name=person", "commit", "-qm", f"edit {path}")
    assert r.returncode == 0, r.stderr
    return git(proj, "rev-parse", "HEAD").stdout.strip()


def outside_edits(root):
    """What a person does in their editor and shell: every kind of change a tree records."""
    (root / "a.txt").write_text("the person's unsaved idea\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(root / "run.sh", 0o750)
    os.symlink("a.txt", root / "alias")
    os.unlink(root / "b.txt")
    (root / "empty").mkdir()
    (root / "bin.dat").write_bytes(bytes(range(256)) * 64)


def undo_step_printed(stdout):
    found = re.findall(r"envgit rewind (\d+)", stdout)
    assert found, stdout
    return found[-1]


def log(proj):
    return json.loads(proj.envgit("log", "--json", check=True).stdout)


def test_the_printed_undo_and_rewind_undo_give_back_outside_edits(proj):
    """Fails on the old code: it printed `envgit rewind <rewind step - 1>`, the tree after the
    last step, so the person's edits made since were gone for good."""
    assert proj.run("echo one > a.txt && echo b > b.txt && mkdir d && echo x > d/f").returncode == 0
    after1 = tree_of(proj.root)
    assert proj.run("echo two > a.txt && rm d/f && echo new > c.txt").returncode == 0
    proj.stop()                                     # no daemon running while the person works
    outside_edits(proj.root)
    commit = person_commits(proj, "c.txt", "committed by the person\n")
    before = tree_of(proj.root)

    r = proj.envgit("rewind", "1", "--yes", check=True)
    assert tree_of(proj.root) == after1
    assert git(proj, "cat-file", "-e", commit).returncode != 0      # gone with .git's objects
    undo = undo_step_printed(r.stdout)
    proj.envgit("rewind", undo, "--yes", check=True)
    assert tree_of(proj.root) == before                             # byte for byte, .git too
    assert git(proj, "rev-parse", "HEAD").stdout.strip() == commit

    proj.envgit("rewind", "1", "--yes", check=True)
    assert tree_of(proj.root) == after1
    r = proj.envgit("rewind", "--undo", "--yes", check=True)
    assert tree_of(proj.root) == before
    assert proj.envgit("fsck").returncode == 0


def test_an_edit_after_the_last_step_is_kept_by_the_undo(bare_proj):
    """The daemon running and idle: the edit is seen by the watcher, recorded before the
    rewind as its own step, and the rewind's undo gives it back."""
    proj = bare_proj
    assert proj.run("echo 1 > f && echo keep > g").returncode == 0
    assert proj.run("echo 2 > f").returncode == 0
    (proj.root / "f").write_text("3, typed by the person\n")
    before = tree_of(proj.root)
    r = proj.envgit("rewind", "last~1", "--yes", check=True)
    assert (proj.root / "f").read_text() == "1\n"
    undo = undo_step_printed(r.stdout)
    s = json.loads(proj.envgit("show", undo, "--json", check=True).stdout)
    assert "outside" in s["marks"] and s["snapshot"]["paths"] == [{"path": "f", "status": "modified"}]
    proj.envgit("rewind", "--undo", "--yes", check=True)
    assert tree_of(proj.root) == before
    # and undo again is a redo: back to the rewind's target
    proj.envgit("rewind", "--undo", "--yes", check=True)
    assert (proj.root / "f").read_text() == "1\n"


def test_outside_changes_are_their_own_step_in_log_show_and_diff(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a && echo 1 > b").returncode == 0
    (proj.root / "a").write_text("edited in the editor\n")        # daemon idle
    (proj.root / "new.txt").write_text("new\n")
    assert proj.run("echo 2 > b").returncode == 0
    steps = log(proj)
    assert [s["id"] for s in steps] == [1, 2, 3]
    out, step = steps[1], steps[2]
    assert "outside" in out["marks"] and out["argv"] == []
    assert sorted((p["path"], p["status"]) for p in out["snapshot"]["paths"]) == \
        [("a", "modified"), ("new.txt", "added")]
    # never charged to the next step
    assert step["snapshot"]["paths"] == [{"path": "b", "status": "modified"}]
    text = proj.envgit("log", check=True).stdout.splitlines()
    row = next(line for line in text if line.split()[0] == "2")
    assert "outside envgit" in row and "a" in row
    shown = proj.envgit("show", "2", check=True).stdout
    assert "outside envgit" in shown and "M a" in shown and "A new.txt" in shown
    d = proj.envgit("diff", "1", "3", check=True).stdout
    assert "outside envgit (step 2)" in d and "step 3" in d
    head, _, rest = d.partition("outside envgit (step 2)")
    outside_part, _, step_part = rest.partition("# step 3")
    assert "+edited in the editor" in outside_part and "+2" not in outside_part
    assert "+2" in step_part and "edited in the editor" not in step_part
    j = json.loads(proj.envgit("diff", "1", "3", "--json", check=True).stdout)
    assert [(p["outside"], sorted(c["path"] for c in p["changes"])) for p in j["parts"]] == \
        [(True, ["a", "new.txt"]), (False, ["b"])]
    # nothing changed outside: no extra step
    assert proj.run("true").returncode == 0
    assert [s["id"] for s in log(proj)] == [1, 2, 3, 4]


def test_outside_changes_with_no_daemon_running_are_recorded_before_the_next_step(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    proj.stop()
    (proj.root / "a").write_text("while no daemon ran\n")
    assert proj.run("cat a > copy").returncode == 0
    steps = log(proj)
    assert "outside" in steps[1]["marks"] and steps[1]["snapshot"]["paths"] == [{"path": "a", "status": "modified"}]
    assert steps[2]["snapshot"]["paths"] == [{"path": "copy", "status": "added"}]


def test_the_policy_is_the_persons_unless_asked(bare_proj):
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    original = (proj.root / "envgit.yaml").read_text()
    mine = original + "\n# the person's own rule\n"
    proj.write_policy(mine)
    assert proj.run("echo 2 > a").returncode == 0
    r = proj.envgit("rewind", "1", "--dry-run", check=True)
    assert "envgit.yaml" in r.stdout and "--policy" in r.stdout
    j = json.loads(proj.envgit("rewind", "1", "--dry-run", "--json", check=True).stdout)
    assert j["policy"] == {"differs": True, "restored": False}
    r = proj.envgit("rewind", "1", "--yes", check=True)
    assert (proj.root / "a").read_text() == "1\n"
    assert (proj.root / "envgit.yaml").read_text() == mine          # left as it is
    proj.envgit("rewind", "1", "--yes", "--policy", check=True)
    assert (proj.root / "envgit.yaml").read_text() == original      # asked for
    proj.envgit("rewind", "--undo", "--yes", check=True)            # the undo puts it back too
    assert (proj.root / "envgit.yaml").read_text() == mine


def pty_envgit(proj, *args, timeout=120):
    """`envgit ARGS` on a real terminal: (exit status, everything it showed)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(proj.root)
        # a terminal of 24 lines of 100 columns, as a person's window has a size
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        os.execve(ENVGIT, [ENVGIT, *args], proj.env)
    out, t0 = b"", time.monotonic()
    try:
        while time.monotonic() - t0 < timeout:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    chunk = b""
                out += chunk
                if chunk:
                    continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), out.decode(errors="replace")
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"envgit {args} did not finish: {out[-2000:]!r}")
    finally:
        os.close(fd)


def test_a_big_rewind_summarises_its_plan_and_shows_progress_on_a_terminal(proj):
    script = ("for d in src lib docs; do mkdir -p $d; i=0; while [ $i -lt 1500 ]; do "
              "echo $d$i > $d/f$i; i=$((i+1)); done; done; git add -A >/dev/null; "
              "git -c user.email=a@b -c user.name=a commit -qm many")
    assert proj.run(script, timeout=300).returncode == 0
    assert proj.run("rm -r src lib && echo x > docs/f1 && git add -A && "
                    "git -c user.email=a@b -c user.name=a commit -qm gone").returncode == 0
    plan = proj.envgit("rewind", "1", "--dry-run", check=True)
    lines = plan.stdout.splitlines()
    assert len(lines) < 40, plan.stdout                   # a summary, not 3000 paths
    assert any(re.search(r"src/\s.*1500", line) for line in lines), plan.stdout
    assert any(re.search(r"lib/\s.*1500", line) for line in lines), plan.stdout
    assert any(line.lstrip().startswith(".git") and "git" in line for line in lines), plan.stdout
    assert not any("f1499" in line for line in lines)
    j = json.loads(proj.envgit("rewind", "1", "--dry-run", "--json", check=True).stdout)
    assert j["counts"]["write"] >= 3000 and {"src", "lib", "docs", ".git"} <= set(j["by_top"])
    # piped: no progress, one result line on stdout
    piped = proj.envgit("rewind", "1", "--yes", check=True)
    assert "rewound to step 1" in piped.stdout and piped.stderr == ""
    proj.envgit("rewind", "--undo", "--yes", check=True)
    assert not (proj.root / "src").exists()
    # on a terminal: the rewind says how far it has got while it writes
    code, shown = pty_envgit(proj, "rewind", "1", "--yes")
    assert code == 0, shown
    assert "rewound to step 1" in shown
    assert re.search(r"\d+/\d+", shown), shown          # the progress bar's count
    assert (proj.root / "src" / "f1499").read_text() == "src1499\n"


def test_a_sandbox_alive_between_steps_is_said_on_the_outside_entry(bare_proj):
    """A long-lived sandboxed helper (started from the daemon's `spec`, as the MCP REPL is,
    and kept between steps) writes between steps: the outside entry says a sandbox could have
    written it (mark `sandbox-alive`), so an agent's late write never passes for the person's."""
    from envgit.daemon.client import connect
    from envgit.paths import Project
    from envgit.sandbox.launch import Launch
    proj = bare_proj
    assert proj.run("echo 1 > a").returncode == 0
    conn = connect(Project(str(proj.root)))
    spec = conn.request({"op": "spec", "argv": ["/bin/sh", "-c", "sleep 0.5; echo late > late.txt; sleep 60"],
                         "cwd": str(proj.root), "env": proj.env})
    conn.close()
    assert "bwrap" in spec, spec
    launch = Launch(spec["bwrap"], str(proj.root))
    proc = subprocess.Popen(launch.argv, env=spec["env"], pass_fds=launch.pass_fds, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    try:
        launch.spawned(proc.pid)
        launch.ready()
        launch.release()
        launch.close()
        late = proj.root / "late.txt"
        deadline = time.monotonic() + 20
        # its content, not its name: the shell makes the file, then writes to it
        while not (late.exists() and late.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert late.read_text() == "late\n"
        assert proj.run("true").returncode == 0
        entry = log(proj)[1]
        assert entry["marks"] == ["outside", "sandbox-alive"], entry
        assert entry["snapshot"]["paths"] == [{"path": "late.txt", "status": "added"}]
    finally:
        proc.kill()
        proc.wait()
    (proj.root / "mine.txt").write_text("the person's\n")        # no sandbox alive now
    assert proj.run("true").returncode == 0
    assert log(proj)[3]["marks"] == ["outside"]


def test_a_file_saved_while_the_rewind_writes_is_not_overwritten(tmp_path):
    """The restore checks each path against the plan's snapshot right before it replaces or
    deletes it: a person's save in between stops the rewind there, the save kept (and the next
    rewind's undo point records it). In-process, on a real directory: the moment between the
    plan and the write is not one a test can hit through the CLI."""
    from envgit.daemon.snapshots import Snapshotter
    from envgit.paths import Project
    from envgit.snapshot.restore import ChangedMeanwhile

    class Policy:                       # what Snapshotter reads of a policy
        snapshot_exclude, max_file_size = [], 256 << 20

    root = tmp_path / "p"
    (root / ".envgit").mkdir(parents=True)
    names = [f"f{i:02}" for i in range(20)]
    for n in names:
        (root / n).write_text("v1\n")
    snap = Snapshotter(Project(str(root)))
    try:
        t1 = snap.take(Policy, None)["tree"]
        for n in names:
            (root / n).write_text("v2\n")
        (root / "gone").write_text("to delete\n")
        t2 = snap.take(Policy, t1)["tree"]
        plan, _ = snap.plan_restore(Policy, t1, None, t2)
        assert len(plan.write) == 20 and len(plan.delete) == 1
        (root / "f10").write_text("saved by the person meanwhile\n")
        with pytest.raises(ChangedMeanwhile, match="f10 changed while the rewind was writing"):
            snap.restore(plan)
        assert (root / "f10").read_text() == "saved by the person meanwhile\n"
        assert (root / "f09").read_text() == "v1\n" and (root / "f11").read_text() == "v2\n"
        # planned afresh, the rewind goes through (the save is in its undo point)
        plan, now = snap.plan_restore(Policy, t1, None, t2)
        assert {"path": "f10", "status": "modified"} in now["paths"]
        snap.restore(plan)
        assert all((root / n).read_text() == "v1\n" for n in names)
    finally:
        snap.close()
