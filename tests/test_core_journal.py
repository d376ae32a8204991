"""The step journal: ids, the chain, interruption, concurrency, the stable JSON of `show`."""

import json
import os
import signal
import sqlite3
import subprocess
import time

from conftest import ENVGIT

SHOW_KEYS = {"id", "argv", "cwd", "exit_code", "signal", "started_at", "ended_at", "duration_ms",
             "policy_sha256", "marks", "denied_paths"}


def test_steps_are_numbered_and_shown(proj):
    assert proj.run("echo one").returncode == 0
    assert proj.run("exit 3").returncode == 3
    log = proj.envgit("log", check=True).stdout.splitlines()
    assert len(log) == 2 and log[0].split()[0] == "1" and "exit   3" in log[1]
    s = json.loads(proj.envgit("show", "2", "--json", check=True).stdout)
    assert SHOW_KEYS <= set(s)
    assert s["id"] == 2 and s["exit_code"] == 3 and s["argv"] == ["sh", "-c", "exit 3"]
    assert s["cwd"] == str(proj.root) and s["signal"] is None
    assert s["policy_sha256"] == __import__("hashlib").sha256((proj.root / "envgit.yaml").read_bytes()).hexdigest()
    assert s["started_at"].endswith("Z") and s["ended_at"] >= s["started_at"]
    assert json.loads(proj.envgit("log", "--json", check=True).stdout)[0]["id"] == 1


def test_show_unknown_step(proj):
    r = proj.envgit("show", "99")
    assert r.returncode == 2 and "no step 99" in r.stderr


def test_fsck_detects_a_changed_entry(proj):
    proj.run("echo a")
    proj.run("echo b")
    assert proj.envgit("fsck").returncode == 0
    proj.stop()
    db = sqlite3.connect(proj.root / ".envgit" / "journal.sqlite")
    db.execute("UPDATE entries SET body = replace(body, 'echo a', 'echo z') WHERE seq = 1")
    db.commit()
    db.close()
    r = proj.envgit("fsck")
    assert r.returncode == 1 and "entry 1" in r.stdout and "changed" in r.stdout


def test_kill_9_of_envgit_run_marks_the_step_interrupted(proj):
    # a duration no other test sleeps for: pgrep below looks machine-wide
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo ready; sleep 30.25"], cwd=proj.root,
                         env=proj.env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.monotonic() + 60      # the daemon's snapshot of the step, on a loaded machine
    while time.monotonic() < deadline:
        s = json.loads(proj.envgit("show", "1", "--json", check=True).stdout)
        if s["status"] != "running":
            break
        time.sleep(0.05)
    assert s["status"] == "interrupted" and "interrupted" in s["marks"]
    assert proj.envgit("fsck").returncode == 0
    # and the sandboxed command did not outlive it (--die-with-parent)
    out = subprocess.run(["pgrep", "-f", "sleep 30.25"], capture_output=True, text=True).stdout
    assert not out.strip()


def test_kill_9_of_the_daemon_mid_step(proj):
    # the step ends when the test closes its stdin, after the kill: a `sleep 2` ended first
    # whenever `envgit daemon status` took 2 s to start on a loaded machine (the step: done)
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo ready; read x"], cwd=proj.root,
                         env=proj.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    st = json.loads(proj.envgit("daemon", "status", check=True).stdout)
    os.kill(st["pid"], signal.SIGKILL)
    p.stdin.close()
    p.wait(timeout=60)
    s = json.loads(proj.envgit("show", "1", "--json", check=True).stdout)
    assert s["status"] == "interrupted"
    assert proj.envgit("fsck").returncode == 0
    assert proj.run("echo after").returncode == 0      # a new daemon takes over
    assert json.loads(proj.envgit("show", "2", "--json", check=True).stdout)["status"] == "done"


def test_two_runs_at_once_get_their_own_ids(proj):
    procs = [subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", f"sleep 0.3; echo {i}"],
                              cwd=proj.root, env=proj.env, stdout=subprocess.PIPE, text=True)
             for i in range(4)]
    for p in procs:
        p.wait(timeout=30)
        assert p.returncode == 0
    steps = json.loads(proj.envgit("log", "--json", check=True).stdout)
    assert sorted(s["id"] for s in steps) == [1, 2, 3, 4]
    assert all(s["status"] == "done" for s in steps)
    assert proj.envgit("fsck").returncode == 0


def test_outside_a_project(tmp_path):
    r = subprocess.run([ENVGIT, "run", "--", "true"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 125 and "envgit init" in r.stderr          # envgit's own failure


def test_run_without_a_command(proj):
    r = proj.envgit("run")
    assert r.returncode == 125 and "envgit run [--] CMD" in r.stderr


def test_shell_rule_is_a_courtesy(proj):
    r = proj.run("git push origin main")
    assert r.returncode == 126 and "refused by shell[0]" in r.stderr
    s = json.loads(proj.envgit("show", "1", "--json", check=True).stdout)
    assert "refused" in s["marks"]
