"""Snapshots after every step and `envgit rewind`, through the real CLI, daemon and git."""

import json
import os
import signal
import subprocess
import time

from conftest import ENVGIT


def git(proj, *args):
    return subprocess.run(["git", "-C", str(proj.root), *args], capture_output=True, text=True)


def setup_repo(proj):
    for k, v in (("user.email", "agent@example.test"), ("user.name", "agent")):
        git(proj, "config", k, v)
    (proj.root / "README").write_text("base\n")
    git(proj, "add", "README")
    git(proj, "commit", "-qm", "base")


def show(proj, n):
    return json.loads(proj.envgit("show", str(n), "--json", check=True).stdout)


def test_reflog_expire_and_gc_scenario(proj):
    setup_repo(proj)
    r = proj.run("echo hi > a.txt && git add a.txt && git commit -qm a && git rev-parse HEAD")
    assert r.returncode == 0, r.stderr
    commit = r.stdout.strip()
    r = proj.run("git reset -q --hard HEAD~1 && git reflog expire --expire=now --all && git gc -q --prune=now")
    assert r.returncode == 0, r.stderr
    assert git(proj, "cat-file", "-e", commit).returncode != 0      # beyond git's reach
    d = proj.envgit("diff", "1", "2", "--stat", check=True).stdout
    assert "D  a.txt" in d and ".git/" in d
    r = proj.envgit("rewind", "1", "--yes", check=True)
    assert "a.txt" in r.stdout
    assert git(proj, "cat-file", "-e", commit).returncode == 0
    assert git(proj, "log", "--oneline").stdout.splitlines()[0].startswith(commit[:7])
    assert (proj.root / "a.txt").read_text() == "hi\n"
    s3 = show(proj, 3)
    assert "rewind" in s3["marks"] and s3["argv"] == ["envgit", "rewind", "1"]
    # the rewind itself can be undone
    proj.envgit("rewind", "2", "--yes", check=True)
    assert not (proj.root / "a.txt").exists()
    assert git(proj, "cat-file", "-e", commit).returncode != 0
    assert proj.envgit("fsck").returncode == 0


def test_step_records_its_snapshot(proj):
    r = proj.run("mkdir -p src && echo one > src/a.py && echo two > src/b.py")
    assert r.returncode == 0
    s = show(proj, 1)["snapshot"]
    assert len(s["tree"]) == 64 and s["added"] == 2 and s["ms"] >= 0
    assert {"path": "src/a.py", "status": "added"} in s["paths"]
    proj.run("echo changed > src/a.py && rm src/b.py")
    s = show(proj, 2)["snapshot"]
    assert (s["added"], s["modified"], s["deleted"]) == (0, 1, 1)


def test_left_out_files_are_said_and_kept(proj):
    proj.write_policy("version: 1\nsnapshot:\n  max_file_size: 1KiB\n  exclude: ['build/**']\n")
    r = proj.run("mkdir -p build && echo x > build/out.o && head -c 4096 /dev/zero > big.bin && echo s > small.txt")
    assert r.returncode == 0
    left = show(proj, 1)["snapshot"]["left_out"]
    paths = {p["path"]: p["reason"] for p in left["paths"]}
    assert paths.get("big.bin") == "too large" and left["count"] >= 2
    assert any(p.startswith("build") for p in paths)
    proj.run("rm small.txt")
    proj.envgit("rewind", "1", "--yes", check=True)
    assert (proj.root / "small.txt").exists()
    assert (proj.root / "big.bin").stat().st_size == 4096 and (proj.root / "build" / "out.o").exists()


def test_rewind_only_some_paths(proj):
    proj.run("echo a1 > a && echo b1 > b")
    proj.run("echo a2 > a && echo b2 > b")
    proj.envgit("rewind", "1", "--yes", "--", "a", check=True)
    assert (proj.root / "a").read_text() == "a1\n" and (proj.root / "b").read_text() == "b2\n"
    # paths as ls, cat and restore take them: one outside the project is refused, ./b is b
    r = proj.envgit("rewind", "1", "--yes", "--", "../../etc")
    assert r.returncode == 2 and "relative to the project's top" in r.stderr, r.stderr
    proj.envgit("rewind", "1", "--yes", "--", "./b", check=True)
    assert (proj.root / "b").read_text() == "b1\n"


def test_rewind_preview_and_refusals(proj):
    proj.run("echo a > a")
    proj.run("echo b > b")
    r = proj.envgit("rewind", "1", "--dry-run")
    assert r.returncode == 0 and "delete (1)" in r.stdout and "b" in r.stdout
    assert (proj.root / "b").exists()
    r = proj.envgit("rewind", "1")            # not a terminal, no --yes
    assert r.returncode == 2 and "--yes" in r.stderr and (proj.root / "b").exists()
    r = proj.envgit("rewind", "9", "--yes")
    assert r.returncode == 2 and "no step 9" in r.stderr
    # running until killed (it waits on its stdin): a `sleep 5` could end before the rewind
    # below reached the daemon on a loaded machine
    p = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo ready; read x"], cwd=proj.root,
                         env=proj.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode == 1 and "is running" in r.stderr
    p.kill()
    p.wait()


def test_diff_text_and_worktree(proj):
    proj.run("printf 'one\\ntwo\\n' > f.txt")
    proj.run("printf 'one\\nTWO\\n' > f.txt")
    d = proj.envgit("diff", "1", "2", check=True).stdout
    assert "-two" in d and "+TWO" in d
    (proj.root / "f.txt").write_text("outside\n")
    d = proj.envgit("diff", check=True).stdout
    assert "working tree" in d and "+outside" in d
    j = json.loads(proj.envgit("diff", "1", "2", "--json", check=True).stdout)
    assert j["changes"][0]["path"] == "f.txt" and j["changes"][0]["status"] == "modified"


def test_gc_keeps_what_the_rule_keeps(proj):
    for i in range(4):
        proj.run(f"head -c 20000 /dev/urandom > blob{i}.bin")
    r = proj.envgit("gc", "--keep-last", "2", check=True)
    assert "dropped the snapshots of 2 step(s)" in r.stdout
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode == 2 and "dropped by `envgit gc`" in r.stderr
    proj.envgit("rewind", "3", "--yes", check=True)
    assert not (proj.root / "blob3.bin").exists() and (proj.root / "blob2.bin").exists()
    assert proj.envgit("fsck").returncode == 0


def test_kill_9_of_the_daemon_during_rewind_is_finished_later(proj):
    for i in range(300):
        (proj.root / f"f{i}.txt").write_text(f"{i}\n")
    proj.run("true")
    proj.run("rm f*.txt")
    st = json.loads(proj.envgit("daemon", "status", check=True).stdout)
    p = subprocess.Popen([ENVGIT, "rewind", "1", "--yes"], cwd=proj.root, env=proj.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(list(proj.root.glob("f*.txt"))) == 0:
        time.sleep(0.001)
    os.kill(st["pid"], signal.SIGKILL)
    p.wait(timeout=20)
    # whatever instant the kill hit, the next envgit command finishes the rewind
    log = proj.envgit("log", "--json", check=True).stdout
    steps = json.loads(log)
    if len(steps) == 3:
        assert steps[2]["status"] == "done" and "rewind" in steps[2]["marks"]
        assert len(list(proj.root.glob("f*.txt"))) == 300
    assert proj.envgit("fsck").returncode == 0


def test_corrupted_object_is_reported_and_refused(proj):
    blob = os.urandom(5000)                   # incompressible: stored raw, findable in its pack
    (proj.root / "data.bin").write_bytes(blob)
    proj.run("true")
    proj.run("rm data.bin")
    proj.stop()
    for pack in (proj.root / ".envgit" / "objects" / "packs").rglob("*.pack"):
        data = bytearray(pack.read_bytes())
        at = data.find(blob)
        if at >= 0:
            data[at + 100] ^= 0xFF
            pack.write_bytes(bytes(data))
            break
    else:
        raise AssertionError("the blob is in no pack")
    r = proj.envgit("fsck")
    assert r.returncode == 1 and ("corrupt" in r.stdout or "damaged" in r.stdout)
    r = proj.envgit("rewind", "1", "--yes")
    assert r.returncode != 0 and "refused" in r.stderr
    assert not (proj.root / "data.bin").exists()
