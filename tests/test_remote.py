"""Remotes on S3-compatible object storage (issue 16, items 1-3), against a real S3 server
(`rclone serve s3` on 127.0.0.1, tests/s3server.py) through the real CLI: push, restore on
another machine, log and fsck from the bucket, kills mid-push, two machines at once,
tampering on the bucket, the .env canary never in clear, audit over three projects, --auto."""

import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from kit.s3 import s3_server  # noqa: F401  (the fixture `s3`)


def machine(tmp_path, name, s3, project="proj", init=True, extra=None) -> Env:
    """A machine: a home of its own (its own ~/.config/envgit), ENVGIT_MACHINE, the S3
    credentials in the environment (the standard AWS chain), and a project `~/<project>`."""
    home = make_home(tmp_path / name)
    root = home / project
    root.mkdir()
    e = Env(home, root, {**s3.env, "ENVGIT_MACHINE": name, **(extra or {})})
    if init:
        e.envgit("init", check=True)
    return e


def add_remote(e: Env, s3, key_file=None, name="ci"):
    args = ["remote", "add", name, s3.url(), "--endpoint", s3.endpoint]
    if key_file:
        args += ["--key-file", str(key_file)]
    return e.envgit(*args, check=True)


def tree_of(root: Path, skip=(".envgit",)) -> dict:
    """relative path -> (kind, permission bits, bytes or link target): what restore must
    reproduce byte for byte."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirs[:] = [d for d in dirs if not (rel == "." and d in skip)]
        for n in dirs + files:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            key = os.path.normpath(os.path.join(rel, n))
            if stat.S_ISLNK(st.st_mode):
                out[key] = ("link", 0, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[key] = ("dir", stat.S_IMODE(st.st_mode), None)
            else:
                out[key] = ("file", stat.S_IMODE(st.st_mode), Path(p).read_bytes())
    return out


def fill(e: Env):
    """A project with what restore must get right: modes, a symlink, nested and empty
    files, a chunked 3 MiB file, a .env holding the canary."""
    r = e.root
    (r / ".env").write_text(f"API_TOKEN={CANARY}\n")
    (r / "src" / "deep" / "er").mkdir(parents=True)
    (r / "src" / "deep" / "er" / "x.py").write_text("print('deep')\n")
    (r / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(r / "run.sh", 0o750)
    (r / "private.txt").write_text("mine\n")
    os.chmod(r / "private.txt", 0o600)
    (r / "empty").write_bytes(b"")
    (r / "big.bin").write_bytes(os.urandom(3 << 20))
    os.symlink("src/deep/er/x.py", r / "link")
    e.run("echo one > step1.txt", check=True)
    e.run("echo two > step2.txt; chmod 711 step2.txt; rm empty", check=True)


def scan_for(s3, needles) -> list:
    hits = []
    for name, path in s3.objects().items():
        data = path.read_bytes()
        hits += [(name, n) for n in needles if n in data]
    return hits


# --- push, then another machine restores, reads the log, checks the bucket ---------------------

def test_push_then_restore_on_another_machine(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    key = Path(m1.home) / ".config/envgit/remotes/ci.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    r = m1.envgit("push", "ci", "--json", check=True)
    pushed = json.loads(r.stdout)
    assert pushed["project"] == "proj" and pushed["machine"] == "m1" and pushed["packs"] >= 1
    # the oracle: the same step restored from the local store on machine 1
    local = tmp_path / "local-restore"
    m1.envgit("restore", "last", "--target", str(local), check=True)

    m2 = machine(tmp_path, "m2", s3, init=False)
    (tmp_path / "key-copy").write_bytes(key.read_bytes())
    add_remote(m2, s3, key_file=tmp_path / "key-copy")
    out = tmp_path / "restored"
    r = m2.envgit("restore", "--from", "ci", "last", "--target", str(out), "--project", "proj",
                  "--machine", "m1", check=True)
    assert "restored step" in r.stdout
    got = tree_of(out)
    assert got == tree_of(local)
    proj = tree_of(m1.root, skip=(".envgit", ".git"))
    for path in ("run.sh", "private.txt", "big.bin", "link", ".env", "step2.txt", "src/deep/er/x.py"):
        assert got[path] == proj[path], path
    assert got["step2.txt"][1] == 0o711 and got["run.sh"][1] == 0o750 and "empty" not in got
    # an earlier step too (the file deleted later is there)
    out1 = tmp_path / "restored-1"
    m2.envgit("restore", "--from", "ci", "1", "--target", str(out1), "--project", "proj", "--machine", "m1", check=True)
    assert (out1 / "empty").exists() and not (out1 / "step2.txt").exists()

    # the journal, read from the bucket, is the journal
    mine = json.loads(m1.envgit("log", "--json", check=True).stdout)
    theirs = json.loads(m2.envgit("log", "--remote", "ci", "--project", "proj", "--machine", "m1",
                                  "--json", check=True).stdout)
    assert theirs["problems"] == [] and theirs["steps"] == mine and len(mine) == 2
    r = m2.envgit("fsck", "--remote", "ci", "--json")
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["ok"]

    # nothing in clear: not the canary, not the pack ids (names are keyed hashes)
    assert scan_for(s3, [CANARY.encode(), b"API_TOKEN"]) == []
    pack_ids = [p.stem for p in (m1.root / ".envgit/objects/packs").rglob("*.pack")]
    assert pack_ids and not any(pid in name for name in s3.objects() for pid in pack_ids)


def test_push_uploads_only_what_the_remote_lacks(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    first = json.loads(m1.envgit("push", "ci", "--json", check=True).stdout)
    again = json.loads(m1.envgit("push", "ci", "--json", check=True).stdout)
    assert again["packs"] == 0 and again["entries"] == 0 and again["head"] == first["head"]
    m1.run("echo three > step3.txt", check=True)
    inc = json.loads(m1.envgit("push", "ci", "--json", check=True).stdout)
    assert inc["packs"] == 1 and inc["entries"] == 2 and inc["head"] == first["head"] + 1
    assert inc["bytes"] < 10_000          # the one new file, not the 3 MiB file again


# --- kills -------------------------------------------------------------------------------------

@pytest.mark.parametrize("point", ["push-pack-uploaded", "push-segment-written"])
def test_kill_during_push_then_push_again(tmp_path, s3, point):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    m1.run("echo more > more.txt; head -c 2000000 /dev/urandom > rnd.bin", check=True)
    r = m1.envgit("push", "ci", env={"ENVGIT_FAULT": point})
    assert r.returncode == -signal.SIGKILL
    # what the killed push left is not trusted: the bucket still reads as the first push
    steps = json.loads(m1.envgit("log", "--remote", "ci", "--json", check=True).stdout)["steps"]
    assert [s["id"] for s in steps] == [1, 2]
    r = m1.envgit("push", "ci", "--json", check=True)
    steps = json.loads(m1.envgit("log", "--remote", "ci", "--json", check=True).stdout)["steps"]
    assert [s["id"] for s in steps] == [1, 2, 3]
    r = m1.envgit("fsck", "--remote", "ci")
    assert r.returncode == 0, r.stdout
    out = tmp_path / "out"
    m1.envgit("restore", "--from", "ci", "last", "--target", str(out), check=True)
    assert (out / "rnd.bin").read_bytes() == (m1.root / "rnd.bin").read_bytes()


def test_kill_9_at_a_random_moment_of_a_first_push(tmp_path, s3):
    """A real kill -9 while objects are being uploaded (no fault point), then push again."""
    m1 = machine(tmp_path, "m1", s3)
    for i in range(4):          # ~4 packs of 16 MiB: many uploads to be killed among
        (m1.root / f"r{i}.bin").write_bytes(os.urandom(15 << 20))
    m1.run("true", check=True)
    add_remote(m1, s3)
    p = subprocess.Popen([ENVGIT, "push", "ci"], cwd=m1.root, env=m1.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        if any("/packs/" in n for n in s3.objects()):
            break
        time.sleep(0.02)
    killed = p.poll() is None
    p.kill()
    p.communicate(timeout=30)
    assert killed, "the push finished before the first pack landed: nothing was interrupted"
    assert "head" not in {n.rsplit("/", 1)[-1] for n in s3.objects()}
    m1.envgit("push", "ci", check=True)
    r = m1.envgit("fsck", "--remote", "ci")
    assert r.returncode == 0, r.stdout
    out = tmp_path / "out"
    m1.envgit("restore", "--from", "ci", "last", "--target", str(out), check=True)
    assert (out / "r3.bin").read_bytes() == (m1.root / "r3.bin").read_bytes()


# --- two machines, one bucket ----------------------------------------------------------------

def test_two_machines_push_at_once(tmp_path, s3):
    ms = [machine(tmp_path, f"m{i}", s3, extra={"ENVGIT_PROJECT": "shared"}) for i in (1, 2)]
    add_remote(ms[0], s3)
    (tmp_path / "key").write_bytes((ms[0].home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(ms[1], s3, key_file=tmp_path / "key")
    for i, m in enumerate(ms):
        m.run(f"echo machine-{i} > who.txt; head -c 3000000 /dev/urandom > r.bin", check=True)
    procs = [subprocess.Popen([ENVGIT, "push", "ci", "--json"], cwd=m.root, env=m.env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for m in ms]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {json.loads(o)["machine"] for o, _ in outs} == {"m1", "m2"}
    r = ms[0].envgit("fsck", "--remote", "ci", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["machines"] == 2, r.stdout
    for i, m in enumerate(ms):
        out = tmp_path / f"out{i}"
        ms[1 - i].envgit("restore", "--from", "ci", "last", "--target", str(out), "--project", "shared",
                         "--machine", f"m{i + 1}", check=True)
        assert (out / "who.txt").read_text() == f"machine-{i}\n"
        assert (out / "r.bin").read_bytes() == (m.root / "r.bin").read_bytes()


# --- tampering on the bucket: fsck --remote names each ----------------------------------------

def _fsck(e):
    r = e.envgit("fsck", "--remote", "ci", "--json")
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)["problems"]


def test_fsck_remote_names_a_flipped_byte_a_deleted_segment_a_moved_object(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    m1.run("echo three > step3.txt", check=True)
    m1.envgit("push", "ci", check=True)
    assert _fsck(m1) == (0, [])
    objs = s3.objects()
    packs = sorted(n for n in objs if "/packs/" in n)
    segs = sorted(n for n in objs if "/journal/" in n)
    assert len(packs) >= 2 and len(segs) == 2

    saved = {n: s3.get(n) for n in objs}
    data = bytearray(saved[packs[0]])
    data[len(data) // 2] ^= 1
    s3.put(packs[0], bytes(data))
    code, problems = _fsck(m1)
    assert code == 1 and any(packs[0] in p and "fails authentication" in p for p in problems), problems
    s3.put(packs[0], saved[packs[0]])

    s3.delete(segs[0])
    code, problems = _fsck(m1)
    assert code == 1 and any("entries 1-" in p and "missing" in p for p in problems), problems
    s3.put(segs[0], saved[segs[0]])
    assert _fsck(m1) == (0, [])

    s3.put(packs[1], saved[packs[0]])       # another pack's object under this name
    code, problems = _fsck(m1)
    assert code == 1 and any(packs[1] in p for p in problems), problems
    s3.put(packs[1], saved[packs[1]])

    s3.put(segs[1], saved[segs[0]])         # an older segment under a later range
    code, problems = _fsck(m1)
    assert code == 1 and any(segs[1] in p for p in problems), problems
    s3.put(segs[1], saved[segs[1]])
    assert _fsck(m1) == (0, [])


def test_fsck_remote_names_a_head_rolled_back(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    old = s3.get("projects/proj/m1/head")
    for n in (3, 4):
        m1.run(f"echo {n} > s{n}.txt", check=True)
        m1.envgit("push", "ci", check=True)
    s3.put("projects/proj/m1/head", old)    # a head from two pushes ago, validly sealed
    code, problems = _fsck(m1)       # the pushing machine saw version 3
    assert code == 1 and any("rolled back" in p and "seen version 3" in p for p in problems), problems
    # a machine that never saw the newer heads: the segments written after them say it
    m2 = machine(tmp_path, "m2", s3, init=False)
    (tmp_path / "key").write_bytes((m1.home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(m2, s3, key_file=tmp_path / "key")
    code, problems = _fsck(m2)
    assert code == 1 and any("rolled back" in p and "after head version" in p for p in problems), problems


# --- audit -------------------------------------------------------------------------------------

def test_audit_across_three_projects(tmp_path, s3):
    key = None
    for i, name in enumerate(("alpha", "beta", "gamma")):
        m = machine(tmp_path, f"h{i}", s3, project=name)
        if key is None:
            add_remote(m, s3)
            key = tmp_path / "key"
            key.write_bytes((m.home / ".config/envgit/remotes/ci.key").read_bytes())
        else:
            add_remote(m, s3, key_file=key)
        (m.root / ".env").write_text(f"TOKEN={CANARY}\n")
        m.run(f"echo {name} > f.txt", check=True)
        if name == "beta":
            m.run("cat .env || true")          # names a file the policy denies: denied-read
        m.envgit("push", "ci", check=True)
    r = m.envgit("audit", "--remote", "ci", "--json", check=True)
    got = json.loads(r.stdout)
    assert got["problems"] == []
    assert {(s["project"], s["machine"]) for s in got["steps"]} == {("alpha", "h0"), ("beta", "h1"), ("gamma", "h2")}
    assert len(got["steps"]) == 4
    r = m.envgit("audit", "--remote", "ci", "--mark", "denied", "--json", check=True)
    marked = json.loads(r.stdout)["steps"]
    assert [(s["project"], s["id"]) for s in marked] == [("beta", 2)]
    r = m.envgit("audit", "--remote", "ci", "--since", "1d", check=True)
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["PROJECT", "MACHINE", "STEP"] and len(lines) == 5
    assert "no steps match" in m.envgit("audit", "--remote", "ci", "--since", "2099-01-01").stdout


# --- --auto ------------------------------------------------------------------------------------

def test_auto_push_after_a_step(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    add_remote(m1, s3)
    m1.envgit("remote", "set", "ci", "--auto", check=True)
    m1.run("echo auto > a.txt", check=True)
    deadline = time.monotonic() + 60
    steps = []
    while time.monotonic() < deadline:
        r = m1.envgit("log", "--remote", "ci", "--json")
        if r.returncode == 0:
            steps = json.loads(r.stdout)["steps"]
            if steps:
                break
        time.sleep(0.5)
    assert [s["argv"] for s in steps] == [["sh", "-c", "echo auto > a.txt"]]
    m1.envgit("remote", "set", "ci", "--no-auto", check=True)
    assert json.loads(m1.envgit("remote", "list", "--json", check=True).stdout)[0]["auto"] is False


def _remote_steps(m, n, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    steps = []
    while time.monotonic() < deadline:
        r = m.envgit("log", "--remote", "ci", "--json")
        if r.returncode == 0:
            steps = json.loads(r.stdout)["steps"]
            if len(steps) >= n:
                break
        time.sleep(0.3)
    return steps


def test_auto_pushes_are_served_by_one_resident_worker_that_ends_with_the_daemon(tmp_path, s3):
    """The interpreter and boto3 start once for a session's auto-pushes, not once a push
    (remote/auto.py): two steps pushed, one worker started; it goes when the daemon stops."""
    m1 = machine(tmp_path, "m1", s3)
    add_remote(m1, s3)
    m1.envgit("remote", "set", "ci", "--auto", check=True)
    m1.run("echo one > a.txt", check=True)
    assert len(_remote_steps(m1, 1)) == 1
    m1.run("echo two > b.txt", check=True)
    assert len(_remote_steps(m1, 2)) == 2
    log = (m1.root / ".envgit" / "push.log").read_text()
    started = re.findall(r"auto-push worker (\d+) started", log)
    assert len(started) == 1, log
    worker = int(started[0])
    assert os.path.exists(f"/proc/{worker}")
    m1.envgit("daemon", "stop", check=True)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{worker}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{worker}") or "zombie" in open(f"/proc/{worker}/status").read().lower()


# --- errors: one line, the fix -----------------------------------------------------------------

def test_errors_are_one_line_with_the_fix(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    r = m1.envgit("push", "nope")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "remote add nope" in r.stderr
    add_remote(m1, s3)
    m2 = machine(tmp_path, "m2", s3)
    r = m2.envgit("remote", "add", "ci", s3.url(), "--endpoint", s3.endpoint)   # a new key: wrong
    assert r.returncode == 1 and "--key-file" in r.stderr and "Traceback" not in r.stderr
    r = m1.envgit("push", "ci", env={"AWS_SECRET_ACCESS_KEY": "wrong-secret-key-wrong"})
    assert r.returncode == 1 and "access denied" in r.stderr and "credentials" in r.stderr, r.stderr
    r = m1.envgit("remote", "add", "x", "http://not-s3")
    assert r.returncode == 1 and "s3://BUCKET/PREFIX" in r.stderr
    (m1.home / ".config/envgit/remotes/ci.key").unlink()
    r = m1.envgit("push", "ci")
    assert r.returncode == 1 and "key" in r.stderr and "back" in r.stderr and "Traceback" not in r.stderr


# --- many small pushes: segments merged, the chain still whole --------------------------------

def test_many_small_pushes_are_merged_into_few_segments(tmp_path, s3, monkeypatch):
    """40 pushes of one step each (the journal written by envgit's own Journal, the push run
    in this process against the real server): a reader then fetches a few segments, not 40."""
    from envgit.journal import Journal
    from envgit.paths import Project
    from envgit.remote import layout
    from envgit.remote.push import push
    from envgit.remote.segments import MERGE_RUN
    m1 = machine(tmp_path, "m1", s3)
    add_remote(m1, s3)
    for k, v in {**m1.env, "XDG_CONFIG_HOME": str(m1.home / ".config")}.items():
        monkeypatch.setenv(k, v)
    project = Project(str(m1.root))
    remote = layout.load("ci")
    j = Journal(project.journal)
    for n in range(MERGE_RUN + 8):
        step = j.begin_step({"argv": ["echo", str(n)], "cwd": str(m1.root), "session": "s1", "marks": []})
        j.append(step, "end", {"exit_code": 0, "signal": None, "marks": []})
        push(project, remote)
    j.close()
    segs = [n for n in s3.objects() if "/journal/" in n]
    assert len(segs) < MERGE_RUN, segs
    got = json.loads(m1.envgit("log", "--remote", "ci", "--json", check=True).stdout)
    assert got["problems"] == [] and len(got["steps"]) == MERGE_RUN + 8
    r = m1.envgit("fsck", "--remote", "ci")
    assert r.returncode == 0, r.stdout


# --- throttling and transient failures ---------------------------------------------------------

def test_push_and_restore_survive_throttling_and_transient_errors(tmp_path, s3):
    """One request in three answered 503 SlowDown, 500 InternalError, or a connection closed
    (a real server behind a proxy that fails some requests, tests/s3server.py Flaky)."""
    from s3server import Flaky
    flaky = Flaky(s3, every=3)
    try:
        m1 = machine(tmp_path, "m1", s3)
        fill(m1)
        m1.envgit("remote", "add", "ci", s3.url(), "--endpoint", flaky.endpoint, check=True)
        m1.envgit("push", "ci", check=True)
        out = tmp_path / "out"
        m1.envgit("restore", "--from", "ci", "last", "--target", str(out), check=True)
        assert (out / "big.bin").read_bytes() == (m1.root / "big.bin").read_bytes()
        r = m1.envgit("fsck", "--remote", "ci")
        assert r.returncode == 0, r.stdout + r.stderr
        assert flaky.failed >= 5
    finally:
        flaky.stop()


def test_push_shows_progress_on_a_terminal(tmp_path, s3):
    import pty
    m1 = machine(tmp_path, "m1", s3)
    (m1.root / "big.bin").write_bytes(os.urandom(20 << 20))
    m1.run("true", check=True)
    add_remote(m1, s3)
    import fcntl
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))    # a terminal's size
    p = subprocess.Popen([ENVGIT, "push", "ci"], cwd=m1.root, env=m1.env, stdin=slave,
                         stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    seen = b""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    p.wait(timeout=60)
    os.close(master)
    assert p.returncode == 0, seen
    assert b"push:" in seen and b"B/s" in seen and b"pushed proj/m1" in seen, seen


def test_a_killed_restore_from_a_remote_leaves_no_half_tree(tmp_path, s3):
    """kill -9 while `restore --from` writes into an existing empty target: the target stays
    empty (the tree is written beside it and renamed over it), never half the step's files;
    the run that follows writes it whole, and a --force run into a tree a killed run wrote
    leaves none of its temporary files there."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    out = tmp_path / "out"
    out.mkdir()
    r = m1.envgit("restore", "--from", "ci", "last", "--target", str(out), env={"ENVGIT_FAULT": "restore-wrote@2"})
    assert r.returncode == -signal.SIGKILL
    assert list(out.iterdir()) == []                        # not half written
    m1.envgit("restore", "--from", "ci", "last", "--target", str(out), "--force", check=True)
    assert tree_of(out) == tree_of(m1.root)
    (out / ".envgit-restore.0123456789ab.tmp").write_text("left by a killed run")
    m1.envgit("restore", "--from", "ci", "last", "--target", str(out), "--force", check=True)
    assert not list(out.rglob(".envgit-restore.*.tmp"))
    assert tree_of(out) == tree_of(m1.root)


def test_fsck_remote_names_a_head_that_does_not_open(tmp_path, s3):
    """A flipped byte in a machine's head: fsck --remote names the bucket object, one line, no
    traceback (it raised AttributeError: 'MachineView' object has no attribute 'listing')."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    head = "projects/proj/m1/head"
    data = bytearray(s3.get(head))
    data[len(data) // 2] ^= 1
    s3.put(head, bytes(data))
    r = m1.envgit("fsck", "--remote", "ci")
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert head in r.stdout + r.stderr, r.stdout + r.stderr
    code, problems = _fsck(m1)
    assert code == 1 and any(head in p for p in problems), problems


def test_fsck_remote_names_a_flipped_head_mark_and_a_flipped_config(tmp_path, s3):
    """A flipped byte in the head's mark (`heads/<version>`) is named by its bucket object; a
    flipped `config` is said to be altered (the heads open with this key, so the key is right),
    not "another key", and the rest of the remote is still checked; with another key, both
    causes are named since the cipher cannot tell them apart."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    assert _fsck(m1) == (0, [])
    mark = next(n for n in s3.objects() if "/heads/" in n)
    saved = s3.get(mark)
    data = bytearray(saved)
    data[-1] ^= 1
    s3.put(mark, bytes(data))
    code, problems = _fsck(m1)
    assert code == 1 and any(mark in p and "fails authentication" in p for p in problems), problems
    s3.put(mark, saved)
    assert _fsck(m1) == (0, [])

    config = s3.get("config")
    data = bytearray(config)
    data[-1] ^= 1
    s3.put("config", bytes(data))
    r = m1.envgit("fsck", "--remote", "ci", "--json")
    problems = json.loads(r.stdout)["problems"]
    assert r.returncode == 1 and len(problems) == 1 and "altered" in problems[0], problems
    assert "'config'" in problems[0] and "another" not in problems[0]
    r = m1.envgit("push", "ci")
    assert r.returncode != 0 and "altered" in r.stderr and "Traceback" not in r.stderr, r.stderr
    # with another key nothing opens: both causes are named
    ro = m1.home / ".config/envgit/remotes/ci.key"
    good = ro.read_bytes()
    ro.write_text("11" * 32 + "\n")
    s3.put("config", bytes(data))
    r = m1.envgit("fsck", "--remote", "ci")
    assert r.returncode != 0 and "another remote's key, or the object altered" in r.stderr, r.stderr
    ro.write_bytes(good)
    s3.put("config", config)
    assert _fsck(m1) == (0, [])


def test_restore_from_a_remote_last_is_the_newest_tree_after_steps_run_at_once(tmp_path, s3):
    """Eight steps at once, the last started ending first (test_parallel_last's order): on the
    remote too, `last` is the step whose snapshot was taken last, not the highest number, so
    `restore --from … last` gives every file the eight wrote."""
    from test_parallel_last import N, eight_at_once
    m1 = machine(tmp_path, "m1", s3)
    ids = eight_at_once(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    out = tmp_path / "out"
    m1.envgit("restore", "--from", "ci", "last", "--target", str(out), check=True)
    assert {f"file{i}" for i in range(1, N + 1)} <= {p.name for p in out.iterdir()}
    assert tree_of(out) == tree_of(m1.root)
    r = m1.envgit("restore", "--from", "ci", "last~1", "--target", str(tmp_path / "out1"), "--json",
                  check=True)
    assert json.loads(r.stdout)["step"] == ids[1]      # the one that ended just before it
