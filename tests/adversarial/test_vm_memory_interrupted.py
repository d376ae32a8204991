"""Attacks on the VM tier's background memory snapshots while one is being written (commits
5377991, 92d25d9: QEMU's `background-snapshot` written while the guest runs, then cut into
chunks, `ok` written last): the daemon killed at each point, commands issued while the write is
held, `envgit daemon stop` during it, the disk filling before, during and after QEMU's write.

What a person relies on: a rewind to step N brings back step N's memory, or says clearly that
it cannot, never a wrong or mixed guest; the daemon is not wedged, the step running is not
hung, and no command prints a traceback or a bare Python exception.

Each test makes a project of its own (the booted guest kept in the VM cache restores in about
half a second): what they do (a daemon killed or started with a fault point, a small tmpfs
mounted over the snapshots) is not left for another test to meet. ENVGIT_FAULT
(src/envgit/faults.py) kills the daemon, or holds a snapshot "being written", at the named
points. Disk-full cases mount a small tmpfs (root). The oracles: `sleep TAG` processes of the
guest, the snapshot directories on disk, the journal, the exit status and words of the CLI.

Holes found are asserted as the correct behaviour: each docstring says "HOLE" and where (the
attacked commits 5377991/92d25d9, and 9d0db0d, which fixed most of them while the attack was
written; 60ffd16 the guest left write-protected); a test still failing at the tree's HEAD is a
hole still open.
"""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ENVGIT
from kit.vmproject import (
    BARE_EXCEPTION,
    HOLDER,
    chunks,
    clean,
    daemon_alive,
    last,
    listed,
    mem,
    memory_project,
    mount_tmpfs,
    settled,
    sleepers,
    start_sleeper,
    teardown,
    wait_for,
)

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")


@pytest.fixture
def vm(tmp_path):
    e = memory_project(tmp_path)
    try:
        yield e
    finally:
        teardown(e)


@pytest.fixture
def vm_big(tmp_path):
    """A guest with room for a stream that takes QEMU a while to write."""
    e = memory_project(tmp_path, memory="768MiB")
    try:
        yield e
    finally:
        teardown(e)


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
    wait_for(flag)
    return last(vm), flag


# --- the daemon killed at each point ---------------------------------------------------------------

def test_a_daemon_killed_at_each_point_leaves_nothing_resumed_and_gc_cleans(vm):
    """Held: kill -9 where the stream is whole and where its chunks and list are written (no
    `ok`): a rewind to that step says files only; fsck is clean (a note); the next step resumes
    from the newest complete snapshot; gc removes the incomplete directory and every chunk no
    complete snapshot lists."""
    start_sleeper(vm, 4646)
    good = last(vm)
    assert settled(vm, good)
    killed = []
    for point in ("vm-memory-written", "vm-memory-chunked"):
        vm.stop()
        r = vm.envgit("run", "--", "sh", "-c", "setsid sleep 4747 >/dev/null 2>&1 < /dev/null &",
                      env={"ENVGIT_FAULT": point}, timeout=300)
        deadline = time.monotonic() + 60
        while daemon_alive(vm) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not daemon_alive(vm), f"{point} was never reached: {r.stderr}"
        step = last(vm)
        assert mem(vm, step).is_dir() and not (mem(vm, step) / "ok").exists()
        killed.append(step)
        r = vm.envgit("show", str(step))
        clean(r)
        r = vm.envgit("fsck")
        clean(r)
        assert r.returncode == 0 and "incomplete" in r.stdout, r.stdout + r.stderr
    r = vm.envgit("rewind", str(killed[-1]), "--yes", timeout=180)
    clean(r)
    assert r.returncode == 0 and "has no memory snapshot" in r.stdout, r.stdout + r.stderr
    assert sleepers(vm, 4646, 4747) == (1, 0)       # resumed from `good`
    r = vm.envgit("gc", "--json", timeout=180)
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    for step in killed:
        assert not mem(vm, step).exists()
    kept = set()
    for d in (vm.root / ".envgit" / "vm" / "mem").iterdir():
        if (d / "ok").exists():
            kept.update(listed(vm, d.name))
    stored = {p.name for p in chunks(vm).glob("*/*")}
    assert stored <= kept, f"{len(stored - kept)} chunks no snapshot lists were left"
    assert vm.envgit("fsck").returncode == 0


# --- commands issued while a snapshot is being written ---------------------------------------------

def test_fsck_show_gc_and_rewind_while_a_snapshot_is_held(vm):
    """Held: the stream whole, its commit held (ENVGIT_FAULT=...:pause). fsck says it is
    incomplete (exit 0); show says it is being written; gc waits for it and keeps it; a rewind
    to it waits and brings its process back."""
    a, flag = _held_step(vm, "vm-memory-written", 4848)
    r = vm.envgit("fsck")
    clean(r)
    assert r.returncode == 0 and "incomplete" in r.stdout, r.stdout
    r = vm.envgit("show", str(a))
    clean(r)
    assert "being written" in r.stdout, r.stdout
    gc = subprocess.Popen([ENVGIT, "gc", "--keep-last", "1", "--json"], cwd=vm.root, env=vm.env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert gc.poll() is None, gc.communicate()          # waits for the snapshot
    assert mem(vm, a).is_dir()
    flag.unlink()
    out, err = gc.communicate(timeout=120)
    assert gc.returncode == 0, out + err
    assert BARE_EXCEPTION.search(out + err) is None, out + err
    assert (mem(vm, a) / "ok").exists()
    assert a not in json.loads(out)["memory_dropped"]
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
    assert sleepers(vm, 4848) == 1


def test_the_command_after_a_daemon_stop_while_a_snapshot_is_written_runs(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). `envgit daemon stop` while a snapshot is
    still being written (held here past 30 s with ENVGIT_FAULT=vm-memory-chunked:pause, as a
    big guest on a slow disk would be: background.py allows 900 s for the write): the daemon's
    stop waits for it (host.stop -> join), but the CLI's `daemon stop` gave up after 30 s and
    exited 0, and the next command spawned a daemon that could not take daemon.lock (the old one
    still held it), waited 30 s for a socket and failed: exit 125, "no session daemon answers
    on .../daemon.sock". At 9d0db0d the stop waits 20 s at most (qemu.STOP_WAIT_S) and the next
    command runs (0b0185f: a command finding the daemon still stopping waits for it); the
    snapshot cut short is then not kept, which a rewind to its step must say. Expected: the
    next command runs, and the step's memory is back or said to be gone."""
    a, flag = _held_step(vm, "vm-memory-chunked", 4949)
    held_at = time.monotonic()
    r = vm.envgit("daemon", "stop", timeout=120)
    clean(r)
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
    if sleepers(vm, 4949) == 0:         # not kept: said so
        r = vm.envgit("rewind", str(a), "--yes", timeout=180)
        clean(r)
        assert "has no memory snapshot" in r.stdout, r.stdout + r.stderr


# --- the disk full ----------------------------------------------------------------------------------

def test_a_snapshot_failing_for_a_full_disk_leaves_the_guest_running(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d): no background snapshot starts without room
    for twice the guest's memory. The disk holding .envgit/vm/mem fills while QEMU writes a
    step's stream (a 20 MB tmpfs here): QEMU's background snapshot fails ("Unable to write to
    file: No space left on device") and QEMU 7.2 leaves the guest's RAM write-protected: its
    vCPU thread sleeps in handle_userfault for ever. envgit only dropped the snapshot (host.py
    `finished`); the next step waited 15 s for the agent's ping, called the machine dead and
    started another guest (the kept boot, or an older step's snapshot): the step's running
    processes were gone as well as its memory snapshot. Expected: a failed snapshot leaves the
    guest running as it was (or the step is told its processes are lost)."""
    mount_tmpfs(vm, vm.root / ".envgit" / "vm" / "mem", "20M")
    start_sleeper(vm, 5353)
    a = last(vm)
    assert not settled(vm, a)           # no room: dropped
    t0 = time.monotonic()
    r = vm.run("echo next", timeout=180)
    took = time.monotonic() - t0
    assert "next" in r.stdout, r.stdout + r.stderr
    assert "booted guest kept" not in r.stderr and "resumed from" not in r.stderr, r.stderr
    assert sleepers(vm, 5353) == 1, f"the guest was replaced ({took:.0f} s): {r.stderr}"
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert "has no memory snapshot" in r.stdout, r.stdout


def test_a_disk_filling_during_the_write_does_not_hang_the_step_running(vm_big):
    """HOLE (open at 5377991/92d25d9 and at 9d0db0d; 60ffd16 ended a guest whose agent did not
    answer within 5 s after a failed snapshot, which a guest idle in `sleep` still did, its vCPU
    asleep only at its next write to a page QEMU had not copied: B hung in a loaded CI run; QEMU
    is now ended whenever its background snapshot fails). The room check (9d0db0d: no background snapshot
    without twice the guest's memory free) is taken once, before the write; the disk then fills
    while QEMU writes step A's stream (here: a file allocated on that disk right after A
    returned; in life the running step's write-back, a build, another project). QEMU's
    background snapshot fails, and QEMU 7.2 leaves the guest's RAM write-protected: its vCPU
    sleeps in handle_userfault for ever. Step B, which was already running in that guest (steps
    may overlap; an agent's next command usually is), never ended: its `envgit run` hung
    (host.ensure's `snapshot_failed` check only ran when a step *begins*; nothing watched a
    guest frozen under a running step). Expected: B ends (its output, or the VM said gone)
    within a bounded time."""
    vm = vm_big
    memdir = vm.root / ".envgit" / "vm" / "mem"
    mount_tmpfs(vm, memdir, "1600M")    # room for the check: 2 x 768 MiB
    (vm.root / "holder.py").write_text(HOLDER)
    vm.run("true", timeout=300)         # the machine up, its first snapshot written
    assert settled(vm, last(vm))
    b = subprocess.Popen([ENVGIT, "run", "--", "sh", "-c",
                          "while [ ! -e /tmp/a-ended ]; do sleep 0.1; done; sleep 4; echo b-done"],
                         cwd=vm.root, env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        r = vm.run("setsid python3 holder.py 450 >/dev/null 2>&1 < /dev/null & "
                   "while [ ! -e /tmp/held ]; do sleep 0.2; done; echo held; touch /tmp/a-ended",
                   timeout=300)
        assert "held" in r.stdout, r.stdout + r.stderr
        a = last(vm)
        fd = os.open(memdir / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
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
            # 120 s: ending it takes the failed write seen, the guest pinged 5 s and killed, and
            # B's stream closed; a CI machine at a load of 8 is several times slower than idle
            out, err = b.communicate(timeout=120)
            hung = False
        except subprocess.TimeoutExpired:
            b.kill()                    # the client this test started
            out, err = b.communicate()
            hung = True
    finally:
        if b.poll() is None:
            b.kill()
    (memdir / "filler").unlink()
    dropped = not settled(vm, a)
    assert not hung, f"step B never ended (120 s) after step {a}'s snapshot " + \
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
    assert settled(vm, last(vm))
    mount_tmpfs(vm, chunks(vm), "20M")
    start_sleeper(vm, 5454)
    a = last(vm)
    assert not settled(vm, a)
    assert sleepers(vm, 5454) == 1
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert r.returncode == 0 and "has no memory snapshot" in r.stdout, r.stdout + r.stderr
    clean(vm.envgit("show", str(a)))
    subprocess.run(["umount", "-l", str(chunks(vm))], check=True)
    vm.mounts.remove(chunks(vm))
    vm.run("true")                      # a step after the rewind: its snapshot has room
    b = last(vm)
    assert settled(vm, b)
    vm.run("pkill -x sleep; true")
    r = vm.envgit("rewind", str(b), "--yes", timeout=180)
    clean(r)
    assert "memory and processes are back" in r.stdout, r.stdout + r.stderr
    assert sleepers(vm, 5454) == 1
