"""Attacks on the VM tier's background memory snapshots (commits 5377991, 92d25d9: QEMU's
`background-snapshot` written while the guest runs, then cut into chunks shared by every
snapshot, `ok` written last; a restore pipes the chunks, each re-hashed, into a new QEMU).

What a person relies on: a rewind to step N brings back step N's memory, or says clearly that
it cannot, never a wrong or mixed guest; nothing a step does (in the guest as root or as an
unprivileged user, or as a step of the default tier in the same project) reaches another step's
memory snapshot or the host; the daemon is not wedged, and no command prints a traceback or a
bare Python exception.

Each test makes a project of its own (the booted guest kept in the VM cache restores in about
half a second). The oracles: the guest's own processes and a program in the guest that checks
its memory (pgrep, a page-stamping writer), the snapshot directories on disk, the journal, the
exit status and words of the CLI. ENVGIT_FAULT (src/envgit/faults.py) kills the daemon, or holds
a snapshot "being written", at the named points. Disk-full cases mount a small tmpfs (root).

Holes found are asserted as the correct behaviour: each test's docstring says "HOLE" and
where (the attacked commits 5377991/92d25d9, and 9d0db0d, which fixed most of them while this
file was written and added the guest paused on poweroff, fixed in turn by 0b0185f); a test
still failing at the tree's HEAD is a hole still open. The rest held.
"""

import ctypes
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ENVGIT, Env
from kit.vmproject import vm_project

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")

BARE_EXCEPTION = re.compile(r"Traceback|\b[A-Z][A-Za-z]*(Error|Exception)\b")

# A program for the guest: writes an 8-byte generation stamp at the start and the end of each
# page of a buffer, page after page, round after round, as fast as it can; on a connection to
# 127.0.0.1:8100 it checks that the buffer is what its own loop variables say (pages before `i`
# at `gen`, the rest at `gen - 1`) and answers "OK pid gen i" or "BAD ...". A snapshot that
# copied some pages after the guest wrote them (not as they were at the pause) fails the check
# once restored.
WRITER = r'''
import os, socket, sys
PAGES = int(sys.argv[1])
P = 4096
buf = bytearray(PAGES * P)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8100))
s.listen(4)
s.setblocking(False)
gen, i = 1, 0
def check():
    bad = []
    for p in range(PAGES):
        want = gen if p < i else gen - 1
        head = int.from_bytes(buf[p * P:p * P + 8], "little")
        tail = int.from_bytes(buf[p * P + P - 8:p * P + P], "little")
        if head != want or tail != want:
            bad.append((p, head, tail, want))
    return bad
with open("/tmp/writer.up", "w") as f:
    f.write(str(os.getpid()))
while True:
    stamp = gen.to_bytes(8, "little")
    buf[i * P:i * P + 8] = stamp
    buf[i * P + P - 8:i * P + P] = stamp
    i += 1
    if i == PAGES:
        gen, i = gen + 1, 0
    if i % 128:
        continue
    try:
        c, _ = s.accept()
    except BlockingIOError:
        continue
    c.setblocking(True)
    c.recv(1024)
    bad = check()
    body = f"OK {os.getpid()} {gen} {i}\n" if not bad else f"BAD {len(bad)} {bad[:4]}\n"
    c.sendall(b"HTTP/1.0 200 OK\r\n\r\n" + body.encode())
    c.close()
'''

# Holds `MB` megabytes of non-zero memory (one random MiB repeated: QEMU writes every page),
# says so in /tmp/held, then sleeps: a big stream, so QEMU's background write takes a while.
# `su` (busybox) to the guest's `nobody`: the guest's python3 crashes (SIGSEGV) under any uid
# but root, so what nobody runs here is shell and busybox.
AS_NOBODY = "su -s /bin/sh nobody -c "

HOLDER = r'''
import os, sys, time
b = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
with open("/tmp/held", "w") as f:
    f.write(str(os.getpid()))
time.sleep(10 ** 6)
'''


# --- the project and its daemon ----------------------------------------------------------------

def _project(base: Path, memory="256MiB") -> Env:
    e = vm_project(base, memory)
    e.flags = base / "flags"            # ENVGIT_FAULT_DIR: where a held point says it is held
    e.flags.mkdir()
    e.mounts = []
    return e


def _held_step(vm, point: str, sleeper: int) -> tuple[int, Path]:
    """A step that leaves `sleep SLEEPER` running, its memory snapshot held at fault point
    `point` (a daemon started anew with ENVGIT_FAULT=point:pause): (its id, the flag whose
    removal lets the snapshot go on)."""
    vm.run("true", timeout=300)
    vm.stop()
    held = {"ENVGIT_FAULT": f"{point}:pause", "ENVGIT_FAULT_DIR": str(vm.flags)}
    r = vm.envgit("run", "--", "sh", "-c", f"setsid sleep {sleeper} >/dev/null 2>&1 < /dev/null &",
                  env=held, timeout=300)
    assert r.returncode == 0, r.stderr
    flag = vm.flags / f"{point}.paused"
    _wait_for(flag)
    return _last(vm), flag


def _daemon_pid(e):
    try:
        text = (e.root / ".envgit" / "daemon.log").read_text(errors="replace")
    except OSError:
        return None
    pids = re.findall(r"envgit daemon (\d+) serving", text)
    return int(pids[-1]) if pids else None


def _daemon_alive(e) -> bool:
    try:
        fd = os.open(e.root / ".envgit" / "daemon.lock", os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def _teardown(e):
    for f in e.flags.iterdir():         # a held point lets go
        f.unlink()
    e.stop()
    deadline = time.monotonic() + 60
    while _daemon_alive(e) and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = _daemon_pid(e)
    if _daemon_alive(e) and pid:        # the daemon this test started (QEMU dies with it)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for m in reversed(e.mounts):
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


@pytest.fixture
def vm(tmp_path):
    e = _project(tmp_path)
    try:
        yield e
    finally:
        _teardown(e)


@pytest.fixture
def vm_big(tmp_path):
    """A guest with room for a stream that takes QEMU a while to write."""
    e = _project(tmp_path, memory="768MiB")
    try:
        yield e
    finally:
        _teardown(e)


def _mount_tmpfs(e, path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {r.stderr.strip()}")
    e.mounts.append(path)


# --- what the project holds --------------------------------------------------------------------

def _steps(e):
    return json.loads(e.envgit("log", "--json", check=True).stdout)


def _last(e) -> int:
    return _steps(e)[-1]["id"]


def _mem(e, step) -> Path:
    return e.root / ".envgit" / "vm" / "mem" / str(step)


def _chunks(e) -> Path:
    return e.root / ".envgit" / "vm" / "chunks"


def _settled(e, step, timeout=120) -> bool:
    """Wait until step's memory snapshot is no longer being written: True when committed."""
    d = _mem(e, step)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (d / "ok").exists():
            return True
        if not d.exists():
            return False
        time.sleep(0.1)
    raise AssertionError(f"step {step}'s memory snapshot still being written after {timeout} s")


def _listed(e, step) -> list[str]:
    return [line.split()[0] for line in (_mem(e, step) /
    "memory.chunks").read_text().splitlines()[1:]]


def _flip(path: Path, at=None):
    os.chmod(path, 0o600)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


def _clean(r):
    """No traceback, no bare Python exception in what the CLI said."""
    text = r.stdout + r.stderr
    assert not BARE_EXCEPTION.search(text), text


def _wait_for(flag: Path, timeout=120):
    deadline = time.monotonic() + timeout
    while not flag.exists():
        assert time.monotonic() < deadline, f"{flag.name} was never reached"
        time.sleep(0.1)


def _pgrep(e, pattern) -> list[str]:
    r = e.run(f"pgrep -f '{pattern}' | grep -v $$ || true", timeout=180)
    assert r.returncode == 0, r.stderr
    return [p for p in r.stdout.split() if p.isdigit()]


def _start_sleeper(e, tag) -> None:
    """A process of the step's own that outlives it: `sleep <tag>` in a session of its own."""
    r = e.run(f"setsid sleep {tag} >/dev/null 2>&1 < /dev/null & echo started", timeout=300)
    assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr


def _sleepers(e, tag) -> int:
    r = e.run(f"for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done "
              f"| grep -c '^sleep {tag} ' || true", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return int(r.stdout.split()[-1])


# --- 1. the chunk store: one damaged chunk, and the snapshots taken after it ----------------------

def test_a_damaged_chunk_is_not_reused_by_a_snapshot_taken_after_it(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). A chunk that is on disk is never written
    again (memchunks.store: `if not os.path.exists(p)`), whatever its bytes: once one chunk
    is damaged (a flipped byte), every later snapshot whose stream holds the same bytes lists
    the damaged file and is committed
    (`ok`) as if whole. A rewind to such a later step then fails ("memory chunk ... is
    damaged") although its own stream was written correctly after the damage: one bad sector
    costs every snapshot from then on, not only the ones that had it."""
    vm.run("true", timeout=300)
    a = _last(vm)
    vm.run("true")
    b = _last(vm)
    assert _settled(vm, a) and _settled(vm, b)
    shared = [h for h in _listed(vm, b) if h in set(_listed(vm, a))]
    assert shared, "two idle steps share no chunk"
    h = shared[len(shared) // 2]
    _flip(_chunks(vm) / h[:2] / h)
    _start_sleeper(vm, 4242)            # the step after the damage, with a process to bring back
    c = _last(vm)
    assert _settled(vm, c)
    assert h in _listed(vm, c), "precondition: the later stream holds the damaged chunk's bytes"
    r = vm.run("pkill -x sleep; true")
    assert _sleepers(vm, 4242) == 0
    r = vm.envgit("rewind", str(c), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" in r.stdout, (
        f"step {c}'s snapshot, taken after chunk {h} was damaged, lists the damaged file:\n{r.stdout}")
    assert _sleepers(vm, 4242) == 1


# --- 2. meta.json damaged ---------------------------------------------------------------------------

def test_a_damaged_meta_of_the_newest_snapshot_does_not_stop_every_step(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). The newest complete snapshot's meta.json
    does not parse (a torn or flipped file):
    a new daemon resumes the machine from it, and host.py's `ensure` reads meta.json outside the
    try that falls back to a boot: every step of the project then fails with exit 125, "the VM
    could not start: Expecting value: line 1 column 11 (char 10)", until the person finds and
    removes the directory by hand. Expected: the damaged snapshot is skipped (said), the VM
    boots (or resumes an older one) and the step runs."""
    vm.run("true", timeout=300)
    a = _last(vm)
    assert _settled(vm, a)
    vm.stop()
    (_mem(vm, a) / "meta.json").write_text('{"setup": tru')
    r = vm.run("echo still-runs", timeout=300)
    _clean(r)
    assert r.returncode == 0 and "still-runs" in r.stdout, r.stdout + r.stderr


def test_a_rewind_to_a_step_whose_meta_is_damaged_says_so_and_ends_its_step(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). meta.json of the step rewound to does not
    parse: host.rewind catches VMError and
    OSError only, the JSONDecodeError (a ValueError) from memstore.read_meta escapes, the CLI
    prints "envgit daemon: JSONDecodeError: Unterminated string ..." with exit 1, and the rewind
    step begun in the journal is never ended (`envgit log` shows it running for ever). The
    preview said "the VM's memory and processes come back" (it looks at `ok` only). Expected:
    the files rewound, "memory was not restored" and why, the rewind step ended."""
    _start_sleeper(vm, 4343)
    a = _last(vm)
    assert _settled(vm, a)
    meta = _mem(vm, a) / "meta.json"
    meta.write_text(meta.read_text()[:100])
    vm.run("true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory was not restored" in r.stdout, r.stdout
    rewinds = [s for s in _steps(vm) if "rewind" in (s.get("marks") or [])]
    assert rewinds and all(s.get("exit_code") is not None for s in rewinds), rewinds
    for cmd in (("fsck",), ("show", str(a))):
        _clean(vm.envgit(*cmd))


# --- 3. the list of chunks damaged --------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["hash", "length", "header"])
def test_a_flipped_byte_in_a_chunk_list_is_said_and_never_resumed(vm, damage):
    """Held: a byte flipped in memory.chunks (a hash, a length, the header) is found by fsck and
    the rewind says the memory was not restored, without a Python exception."""
    _start_sleeper(vm, 4444)
    a = _last(vm)
    assert _settled(vm, a)
    lst = _mem(vm, a) / "memory.chunks"
    text = lst.read_text()
    lines = text.splitlines()
    n = len(lines) // 2
    if damage == "hash":
        pos = text.index(lines[n]) + 10
    elif damage == "length":
        pos = text.index(lines[n]) + len(lines[n]) - 1
    else:
        pos = 3
    _flip(lst, pos)
    r = vm.envgit("fsck")
    _clean(r)
    assert r.returncode != 0 and f"memory snapshot of step {a} is damaged" in r.stdout, r.stdout
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0 and "memory was not restored" in r.stdout, r.stdout + r.stderr
    assert "memory and processes are back" not in r.stdout
    assert _sleepers(vm, 4444) == 0


def test_a_chunk_list_missing_a_line_is_not_resumed_as_a_whole_guest(vm):
    """HOLE at 92d25d9 + the page-record cut (fixed at 9d0db0d): meta.json keeps the list's
    BLAKE3.
    One line taken out of the middle of memory.chunks (every chunk it still names is
    whole): fsck says "ok" and the rewind says "the VM's memory and processes are back", a guest
    resumed with those pages as zeros. Nothing binds the list to the stream it was cut from:
    meta.json records the stream's `bytes` and `chunks`, which neither the restore
    (qemu.restore / memchunks.stream_into) nor fsck (memchunks.verify) compares, and the
    record-aligned cut (memchunks.cuts in the working tree) leaves a stream missing whole
    chunks one QEMU loads without a word. A torn list, or one copied over from another step,
    resumes a wrong guest the same way."""
    _start_sleeper(vm, 4545)
    a = _last(vm)
    assert _settled(vm, a)
    lst = _mem(vm, a) / "memory.chunks"
    lines = lst.read_text().splitlines()
    del lines[len(lines) // 2]
    os.chmod(lst, 0o600)
    lst.write_text("\n".join(lines) + "\n")
    r = vm.envgit("fsck")
    _clean(r)
    fsck_found = r.returncode != 0 and f"step {a}" in r.stdout
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" not in r.stdout, (
        "a list missing a chunk was restored as the step's memory:\n" + r.stdout)
    assert fsck_found, "fsck found nothing wrong with a list missing a chunk"


# --- 4. the daemon killed at each point ---------------------------------------------------------------

def test_a_daemon_killed_at_each_point_leaves_nothing_resumed_and_gc_cleans(vm):
    """Held: kill -9 where the stream is whole and where its chunks and list are written (no
    `ok`): a rewind to that step says files only; fsck is clean (a note); the next step resumes
    from the newest complete snapshot; gc removes the incomplete directory and every chunk no
    complete snapshot lists."""
    _start_sleeper(vm, 4646)
    good = _last(vm)
    assert _settled(vm, good)
    killed = []
    for point in ("vm-memory-written", "vm-memory-chunked"):
        vm.stop()
        r = vm.envgit("run", "--", "sh", "-c", "setsid sleep 4747 >/dev/null 2>&1 < /dev/null &",
                      env={"ENVGIT_FAULT": point}, timeout=300)
        deadline = time.monotonic() + 60
        while _daemon_alive(vm) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _daemon_alive(vm), f"{point} was never reached: {r.stderr}"
        step = _last(vm)
        assert _mem(vm, step).is_dir() and not (_mem(vm, step) / "ok").exists()
        killed.append(step)
        r = vm.envgit("show", str(step))
        _clean(r)
        r = vm.envgit("fsck")
        _clean(r)
        assert r.returncode == 0 and "incomplete" in r.stdout, r.stdout + r.stderr
    r = vm.envgit("rewind", str(killed[-1]), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0 and "has no memory snapshot" in r.stdout, r.stdout + r.stderr
    assert _sleepers(vm, 4646) == 1 and _sleepers(vm, 4747) == 0     # resumed from `good`
    r = vm.envgit("gc", "--json", timeout=180)
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    for step in killed:
        assert not _mem(vm, step).exists()
    listed = set()
    for d in (vm.root / ".envgit" / "vm" / "mem").iterdir():
        if (d / "ok").exists():
            listed.update(_listed(vm, d.name))
    stored = {p.name for p in _chunks(vm).glob("*/*")}
    assert stored <= listed, f"{len(stored - listed)} chunks no snapshot lists were left"
    assert vm.envgit("fsck").returncode == 0


# --- 5. commands issued while a snapshot is being written --------------------------------------------

def test_fsck_show_gc_and_rewind_while_a_snapshot_is_held(vm):
    """Held: the stream whole, its commit held (ENVGIT_FAULT=...:pause). fsck says it is
    incomplete (exit 0); show says it is being written; gc waits for it and keeps it; a rewind
    to it waits and brings its process back."""
    a, flag = _held_step(vm, "vm-memory-written", 4848)
    r = vm.envgit("fsck")
    _clean(r)
    assert r.returncode == 0 and "incomplete" in r.stdout, r.stdout
    r = vm.envgit("show", str(a))
    _clean(r)
    assert "being written" in r.stdout, r.stdout
    gc = subprocess.Popen([ENVGIT, "gc", "--keep-last", "1", "--json"], cwd=vm.root, env=vm.env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert gc.poll() is None, gc.communicate()          # waits for the snapshot
    assert _mem(vm, a).is_dir()
    flag.unlink()
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, out + err
    assert BARE_EXCEPTION.search(out + err) is None, out + err
    assert (_mem(vm, a) / "ok").exists()
    assert a not in json.loads(out)["memory_dropped"]
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
    assert _sleepers(vm, 4848) == 1


def test_the_command_after_a_daemon_stop_while_a_snapshot_is_written_runs(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). `envgit daemon stop` while a snapshot is
    still being written
    (held here past 30 s with ENVGIT_FAULT=vm-memory-chunked:pause, as a big guest on a slow
    disk would be: background.py allows 900 s for the write): the daemon's stop waits for it
    (host.stop -> join), but the CLI's `daemon stop` gives up after 30 s and exits 0, and the
    next command spawns a daemon that cannot take daemon.lock (the old one still holds it),
    waits 30 s for a socket and fails: exit 125, "no session daemon answers on
    .../daemon.sock". At 9d0db0d the stop waits 20 s at most (qemu.STOP_WAIT_S) and the next
    command runs (0b0185f: a command finding the daemon still stopping waits for it); the
    snapshot cut short is then not kept, which a rewind to its step must say. Expected: the
    next command runs, and the step's memory is back or said to be gone."""
    a, flag = _held_step(vm, "vm-memory-chunked", 4949)
    held_at = time.monotonic()
    r = vm.envgit("daemon", "stop", timeout=120)
    _clean(r)
    nxt = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", "echo next-ran"], cwd=vm.root,
                           env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # the write ends 45 s after it was held (the pause gives up by itself at 60 s)
    while nxt.poll() is None and time.monotonic() - held_at < 45:
        time.sleep(0.2)
    if flag.exists():
        flag.unlink()
    out, err = nxt.communicate(timeout=150)
    assert BARE_EXCEPTION.search(out + err) is None, out + err
    assert nxt.returncode == 0 and "next-ran" in out, (nxt.returncode, out, err)
    if _sleepers(vm, 4949) == 0:        # not kept: said so
        r = vm.envgit("rewind", str(a), "--yes", timeout=180)
        _clean(r)
        assert "has no memory snapshot" in r.stdout, r.stdout + r.stderr


# --- 6. other steps acting while a snapshot is written --------------------------------------------------

@pytest.mark.parametrize("sysrq", ["o", "b"])
def test_a_poweroff_in_the_next_step_neither_loses_the_previous_steps_memory_nor_hangs(vm_big, sysrq):
    """HOLE, twice (the first fixed at 9d0db0d, the second at 0b0185f). Step A ends (its memory is being
    written by QEMU while the guest runs on);
    the next step B, root in the guest, powers the guest off (`echo o > /proc/sysrq-trigger`)
    or resets it (`echo b`; `poweroff -f`, `reboot -f`, a kernel panic do the same).
    At 5377991/92d25d9: QEMU exits mid-write (-no-reboot), background.py's `_wait` gets "QEMU
    stopped during the background snapshot" and host.py's `finished` removes A's directory: A's
    memory is gone because of what a later step did (`envgit show A` says "not kept (the daemon
    stopped before it was written whole, or gc removed it)", neither of which happened).
    At 9d0db0d (-action shutdown=pause,panic=pause): A's snapshot is kept, but the guest sits
    paused and step B's `envgit run` never returns (SIGTERM forwarded to a paused guest does
    nothing either): only another command, which finds the machine dead, ends it (125).
    Expected: A's snapshot committed and restorable, and B ended (the VM said gone) promptly."""
    vm = vm_big
    (vm.root / "holder.py").write_text(HOLDER)
    r = vm.run("setsid python3 holder.py 450 >/dev/null 2>&1 < /dev/null & "
               "while [ ! -e /tmp/held ]; do sleep 0.2; done; echo held", timeout=300)
    assert "held" in r.stdout, r.stdout + r.stderr
    a = _last(vm)
    b = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", f"echo {sysrq} > /proc/sysrq-trigger; sleep 5"],
                         cwd=vm.root, env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        out, err = b.communicate(timeout=60)
        hung = False
    except subprocess.TimeoutExpired:
        b.kill()                        # the client this test started
        out, err = b.communicate()
        hung = True
    committed = _settled(vm, a)
    assert committed, f"step {a}'s memory snapshot was dropped because the next step stopped the guest"
    assert not hung, "the step that powered the guest off never ended (60 s): the guest sits paused"
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr


def test_an_unprivileged_guest_user_cannot_stop_the_guest_during_a_snapshot(vm_big):
    """Held: the same as root's poweroff, tried as `nobody` in the guest (sysrq-trigger,
    poweroff -f, kill -9 of pid 1, the agent's ports): refused, and the previous step's
    snapshot is committed and restores."""
    vm = vm_big
    (vm.root / "holder.py").write_text(HOLDER)
    r = vm.run("setsid python3 holder.py 450 >/dev/null 2>&1 < /dev/null & "
               "while [ ! -e /tmp/held ]; do sleep 0.2; done; echo held", timeout=300)
    assert "held" in r.stdout, r.stdout + r.stderr
    a = _last(vm)
    r = vm.run(AS_NOBODY + "'id -u; echo o > /proc/sysrq-trigger; poweroff -f; kill -9 1; "
               "for p in /dev/vport* /dev/virtio-ports/*; do echo x > $p; done; "
               "echo c > /proc/sysrq-trigger' 2>/dev/null; echo tried", timeout=180)
    assert "65534" in r.stdout and "tried" in r.stdout, r.stdout + r.stderr
    assert _settled(vm, a)
    vm.run("pkill -f holder.py; true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("hammer", ["root", "nobody"])
def test_a_guest_writing_furiously_during_the_copy_gets_a_consistent_snapshot(vm, hammer):
    """Held: a program (root) stamps every page of 64 MiB over and over while its step's
    snapshot is written, a loop of root's or of the unprivileged `nobody` rewrites 16 MB of
    /tmp (guest page cache) meanwhile, and the next step pushes a 40 MB file into the guest
    (the agent's port writing guest memory) during the same copy. Restored, the program finds
    every page as its own loop variables say (no page copied after it was written), and the
    file is not there."""
    (vm.root / "writer.py").write_text(WRITER)
    loop = "'while :; do dd if=/dev/urandom of=/tmp/hammer-$$ bs=64k count=256 2>/dev/null; done'"
    start = ("setsid sh -c " + loop) if hammer == "root" else ("setsid " + AS_NOBODY + loop)
    r = vm.run(f"{start} >/dev/null 2>&1 < /dev/null & "
               "setsid python3 writer.py 16384 >/dev/null 2>&1 < /dev/null & "
               "while [ ! -e /tmp/writer.up ]; do sleep 0.2; done; wget -qO- http://127.0.0.1:8100/; "
               "sleep 1; ls -ln /tmp | grep hammer", timeout=300)
    assert r.stdout.startswith("OK"), r.stdout + r.stderr
    assert (" 65534 " in r.stdout) == (hammer == "nobody"), r.stdout      # who hammers
    pid = r.stdout.split()[1]
    a = _last(vm)
    with open(vm.root / "big.bin", "wb") as f:
        f.write(os.urandom(40 << 20))
    r = vm.run("wget -qO- http://127.0.0.1:8100/; test -s big.bin && echo pushed", timeout=300)
    assert r.stdout.startswith("OK") and "pushed" in r.stdout, r.stdout + r.stderr
    assert _settled(vm, a)
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
    r = vm.run("wget -qO- http://127.0.0.1:8100/; test -e big.bin && echo big-there; "
               "pkill -f hammer; true", timeout=180)
    assert r.stdout.startswith(f"OK {pid} "), r.stdout + r.stderr
    assert "big-there" not in r.stdout


def test_two_steps_ending_together_both_keep_their_memory(vm):
    """Held: two steps run at once in the guest and end within milliseconds of each other;
    the second snapshot waits for the first; both are committed, fsck is clean, and each
    rewinds to a guest with both steps' processes."""
    vm.run("true", timeout=300)
    script = ("setsid sleep {tag} >/dev/null 2>&1 < /dev/null & touch /tmp/s{tag}; "
              "while [ ! -e /tmp/s5151 ] || [ ! -e /tmp/s5252 ]; do sleep 0.05; done")
    procs = [subprocess.Popen([ENVGIT, "run", "--", "sh", "-c", script.format(tag=tag)], cwd=vm.root,
                              env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for tag in (5151, 5252)]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, out + err
    ids = [s["id"] for s in _steps(vm) if "s5151" in " ".join(s["argv"]) or "s5252" in " ".join(s["argv"])]
    assert len(ids) == 2
    for step in ids:
        assert _settled(vm, step), f"step {step}'s snapshot was dropped"
    assert vm.envgit("fsck").returncode == 0
    for step in ids:
        vm.run("pkill -x sleep; true")
        r = vm.envgit("rewind", str(step), "--yes", timeout=180)
        _clean(r)
        assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
        assert _sleepers(vm, 5151) == 1 and _sleepers(vm, 5252) == 1


# --- 7. the disk full ----------------------------------------------------------------------------------

def test_a_snapshot_failing_for_a_full_disk_leaves_the_guest_running(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d): no background snapshot starts without room
    for
    twice the guest's memory. The disk holding .envgit/vm/mem fills while QEMU writes a step's
    stream (a 20 MB tmpfs here): QEMU's background snapshot fails ("Unable to write to file: No
    space left on
    device") and QEMU 7.2 leaves the guest's RAM write-protected: its vCPU thread sleeps in
    handle_userfault for ever. envgit only drops the snapshot (host.py `finished`); the next
    step waits 15 s for the agent's ping, calls the machine dead and starts another guest (the
    kept boot, or an older step's snapshot): the step's running processes are gone as well as
    its memory snapshot. Expected: a failed snapshot leaves the guest running as it was (or
    the step is told its processes are lost)."""
    _mount_tmpfs(vm, vm.root / ".envgit" / "vm" / "mem", "20M")
    _start_sleeper(vm, 5353)
    a = _last(vm)
    assert not _settled(vm, a)          # no room: dropped
    t0 = time.monotonic()
    r = vm.run("echo next", timeout=180)
    took = time.monotonic() - t0
    assert "next" in r.stdout, r.stdout + r.stderr
    assert "booted guest kept" not in r.stderr and "resumed from" not in r.stderr, r.stderr
    assert _sleepers(vm, 5353) == 1, f"the guest was replaced ({took:.0f} s): {r.stderr}"
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert "has no memory snapshot" in r.stdout, r.stdout


def test_a_disk_filling_during_the_write_does_not_hang_the_step_running(vm_big):
    """HOLE (open at 5377991/92d25d9 and at 9d0db0d). The room check (9d0db0d: no background
    snapshot without twice the guest's memory
    free) is taken once, before the write; the disk then fills while QEMU writes step A's
    stream (here: a file allocated on that disk right after A returned; in life the running
    step's write-back, a build, another project). QEMU's background snapshot fails, and QEMU
    7.2 leaves the guest's RAM write-protected: its vCPU sleeps in handle_userfault for ever.
    Step B, which was already running in that guest (steps may overlap; an agent's next command
    usually is), never ends: its `envgit run` hangs (host.ensure's `snapshot_failed` check only
    runs when a step *begins*; nothing watches a guest frozen under a running step).
    Expected: B ends (its output, or the VM said gone) within a bounded time."""
    vm = vm_big
    mem = vm.root / ".envgit" / "vm" / "mem"
    _mount_tmpfs(vm, mem, "1600M")      # room for the check: 2 x 768 MiB
    (vm.root / "holder.py").write_text(HOLDER)
    vm.run("true", timeout=300)         # the machine up, its first snapshot written
    assert _settled(vm, _last(vm))
    b = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c",
                          "while [ ! -e /tmp/a-ended ]; do sleep 0.1; done; sleep 4; echo b-done"],
                         cwd=vm.root, env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        r = vm.run("setsid python3 holder.py 450 >/dev/null 2>&1 < /dev/null & "
                   "while [ ! -e /tmp/held ]; do sleep 0.2; done; echo held; touch /tmp/a-ended",
                   timeout=300)
        assert "held" in r.stdout, r.stdout + r.stderr
        a = _last(vm)
        fd = os.open(mem / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:                            # every free block taken, QEMU writing meanwhile
            for size in (16 << 20, 1 << 20, 4096):
                off = os.fstat(fd).st_size
                while True:
                    try:
                        os.posix_fallocate(fd, off, size)
                    except OSError:
                        break
                    off += size
        finally:
            os.close(fd)
        try:
            out, err = b.communicate(timeout=60)
            hung = False
        except subprocess.TimeoutExpired:
            b.kill()                    # the client this test started
            out, err = b.communicate()
            hung = True
    finally:
        if b.poll() is None:
            b.kill()
    (mem / "filler").unlink()
    dropped = not _settled(vm, a)
    assert not hung, f"step B never ended (60 s) after step {a}'s snapshot " + \
        ("failed for the full disk" if dropped else "was written")
    assert "b-done" in out or "VM" in err, (out, err)
    r = vm.run("echo after", timeout=180)
    assert "after" in r.stdout, r.stdout + r.stderr


def test_a_full_disk_while_chunking_drops_the_snapshot_cleanly(vm):
    """Held: the chunk store's disk fills while a stream is cut into chunks (a 20 MB tmpfs on
    .envgit/vm/chunks): the snapshot is dropped (no `ok`), the guest runs on with its process,
    a rewind to the step says files only, fsck and show say nothing wrong beyond it; once the
    disk has room again the next snapshot is kept and restores."""
    vm.run("true", timeout=300)
    assert _settled(vm, _last(vm))
    _mount_tmpfs(vm, _chunks(vm), "20M")
    _start_sleeper(vm, 5454)
    a = _last(vm)
    assert not _settled(vm, a)
    assert _sleepers(vm, 5454) == 1
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    _clean(r)
    assert r.returncode == 0 and "has no memory snapshot" in r.stdout, r.stdout + r.stderr
    _clean(vm.envgit("show", str(a)))
    subprocess.run(["umount", "-l", str(_chunks(vm))], check=True)
    vm.mounts.remove(_chunks(vm))
    vm.run("true")                      # a step after the rewind: its snapshot has room
    b = _last(vm)
    assert _settled(vm, b)
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(b), "--yes", timeout=180)
    _clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
    assert _sleepers(vm, 5454) == 1


# --- 8. steps reaching for the chunk store ----------------------------------------------------------

def test_no_step_reaches_the_chunk_store(vm):
    """Held: root and nobody in the guest, and a step of the default tier (the same project,
    `backend: vm` taken out of envgit.yaml for that step), try to plant files in
    .envgit/vm/chunks (directly, and through a symlink to it that the guest writes back) and a
    symlink in place of a prefix directory there: nothing lands there, and gc afterwards
    removes nothing outside the store."""
    victim = vm.home / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    vm.run("true", timeout=300)
    a = _last(vm)
    assert _settled(vm, a)
    before = {p.relative_to(_chunks(vm)) for p in _chunks(vm).rglob("*")}
    plant = ("mkdir -p .envgit/vm/chunks/00 && echo x > .envgit/vm/chunks/00/planted; "
             "ln -sfn .envgit/vm/chunks chunklink; ln -sfn " + str(victim) + " victimlink; "
             "mkdir -p chunklink/01; echo y > chunklink/01/planted; ln -sfn " + str(victim) +
             " chunklink/zz; true")
    r = vm.run(plant)
    assert r.returncode == 0, r.stdout + r.stderr
    r = vm.run(AS_NOBODY + "'" + plant.replace("'", "") + "'; true")
    vm.run("mkdir -p chunklink/02; echo z > chunklink/02/planted; true")
    # the same project, a step of the default tier
    policy = (vm.root / "envgit.yaml").read_text()
    (vm.root / "envgit.yaml").write_text(policy.replace("backend: vm\n", ""))
    r = vm.run(plant + "; mkdir -p chunklink/03 && echo w > chunklink/03/planted; true", timeout=180)
    (vm.root / "envgit.yaml").write_text(policy)
    after = {p.relative_to(_chunks(vm)) for p in _chunks(vm).rglob("*")}
    vm.run("true")
    assert _settled(vm, _last(vm))
    planted = [str(p) for p in (after - before)
               if "planted" in str(p) or str(p) in ("zz", "00", "01", "02", "03")]
    assert not planted, planted
    r = vm.envgit("gc", "--keep-last", "1", timeout=180)
    _clean(r)
    assert (victim / "precious.txt").read_text() == "keep me\n"


# --- 9. what else may be found in the chunk store ----------------------------------------------------

def test_a_stray_file_in_the_chunk_store_breaks_neither_gc_nor_stats(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d) (robustness; no step can put it there:
    .envgit is hidden from steps). A regular file
    directly under .envgit/vm/chunks (a `.DS_Store`, a note, a backup tool's marker): `envgit
    stats` exits 1 with "envgit: Not a directory: .../chunks/README" and `envgit gc` with
    "envgit daemon: NotADirectoryError: [Errno 20] ...", after gc has already dropped the steps'
    file snapshots and written gc-done (memchunks.sweep and usage list every entry of the
    store as a directory)."""
    vm.run("true", timeout=300)
    assert _settled(vm, _last(vm))
    (_chunks(vm) / "README").write_text("a note\n")
    r = vm.envgit("stats")
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    r = vm.envgit("gc", "--keep-last", "1", timeout=180)
    _clean(r)
    assert r.returncode == 0, r.stdout + r.stderr


def test_gc_never_removes_files_outside_the_chunk_store(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d) (needs write access to .envgit, which no step
    has). A prefix directory of the store
    that is a symlink (`chunks/zz -> ~/victim`, as a person moving part of the store to
    another disk would make it): gc's sweep lists it as a directory of chunks and removes every
    file in the target that no snapshot lists: ~/victim/precious.txt is deleted. sweep (and
    usage) follow the link: os.listdir of the joined path, no lstat / O_NOFOLLOW check."""
    victim = vm.home / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    vm.run("true", timeout=300)
    assert _settled(vm, _last(vm))
    (_chunks(vm) / "zz").symlink_to(victim)
    r = vm.envgit("gc", "--keep-last", "1", timeout=180)
    _clean(r)
    assert (victim / "precious.txt").exists(), "gc deleted a file outside the chunk store"


# --- 10. durability of a committed snapshot ----------------------------------------------------------

def test_a_committed_snapshot_has_its_chunks_and_list_on_disk(tmp_path, monkeypatch):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d): syncfs before meta.json and `ok` (power loss,
    not kill -9). What host.py's `finished` does once QEMU's stream is
    whole: memchunks.store (chunks written under a temporary name and renamed, then the list),
    then memstore.commit (meta.json fsynced, the directory fsynced, `ok`). Neither a chunk nor
    the list is fsynced, nor the store's directories: after a power cut the durable `ok` and
    meta.json can stand beside an empty list or empty chunks. memstore's docstring says `ok`
    is "written last (after an fsync of the rest)"; FORMAT.md's crash-safety rule 2 (write,
    fsync, rename, fsync the directory) is kept by the file snapshot store, not here. The
    restore's hash check would then refuse it: the step's memory is lost, not resumed wrong."""
    from envgit.vm import memchunks, memstore
    synced = set()
    real_fsync = os.fsync

    def recording(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording)
    monkeypatch.setattr(os, "fdatasync", recording)
    whole = set()                       # filesystems synced whole: syncfs(2) (its device), sync(2)
    real_sync, real_cdll = os.sync, ctypes.CDLL

    def sync_all():
        whole.add("all")
        return real_sync()

    class Libc:
        def __init__(self, *a, **kw):
            self._real = real_cdll(*a, **kw)

        def __getattr__(self, name):
            f = getattr(self._real, name)
            if name != "syncfs":
                return f

            def syncfs(fd):
                whole.add(os.fstat(fd).st_dev)
                return f(fd)
            return syncfs

    monkeypatch.setattr(os, "sync", sync_all)
    monkeypatch.setattr(ctypes, "CDLL", Libc)
    vm_state = tmp_path / "vm"
    d = vm_state / "mem" / "7"
    d.mkdir(parents=True)
    (d / memstore.STREAM).write_bytes(os.urandom(700_000))
    got = memchunks.store(memchunks.root(str(vm_state)), str(d / memstore.STREAM),
                          str(d / memchunks.LIST))
    memstore.commit(str(d), {"format": memstore.CHUNKS_FORMAT, **got, "step": 7})
    croot = Path(memchunks.root(str(vm_state)))
    needed = [d / memchunks.LIST, croot]
    for h in memchunks.read_list(str(d / memchunks.LIST)):
        p = Path(memchunks.chunk_path(str(croot), h[0]))
        needed += [p, p.parent]

    def ident(p):
        st = os.stat(p)
        return (st.st_dev, st.st_ino)

    unsynced = sorted({str(p.relative_to(tmp_path)) for p in needed
                       if ident(p) not in synced and ident(p)[0] not in whole and "all" not in
    whole})
    assert not unsynced, f"committed (ok) with {len(unsynced)} files/directories never fsynced: {unsynced[:4]}"
