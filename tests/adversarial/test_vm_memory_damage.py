"""Attacks on the VM tier's memory snapshots at rest (commits 5377991, 92d25d9: QEMU's
`background-snapshot` cut into chunks shared by every snapshot, `ok` written last; a restore
pipes the chunks, each re-hashed, into a new QEMU): a chunk, a list of chunks or a meta.json
damaged on disk, a stray file or a linked directory in the chunk store, a power cut after `ok`.

What a person relies on: a rewind to step N brings back step N's memory, or says clearly that
it cannot, never a wrong or mixed guest; damage is found by fsck, one damaged chunk does not
cost the snapshots taken after it, gc never removes a file outside the store, and no command
prints a traceback or a bare Python exception.

The tests asking for `vm` share one project and guest (tests/kit/vmproject.py shared_project):
each makes steps of its own and puts back the bytes it damaged, and the project is checked
sound (fsck clean) after each, or replaced. The damaged newest meta.json has a project of its
own: there it is the only snapshot, so the daemon must boot rather than resume an older one.
The oracles: `sleep TAG` processes of the guest, the snapshot directories on disk, the journal,
the exit status and words of the CLI.

Holes found are asserted as the correct behaviour: each docstring says "HOLE" and where (the
attacked commits 5377991/92d25d9, and 9d0db0d, which fixed them while the attack was written).
"""

import ctypes
import json
import os
import shutil
from pathlib import Path

import pytest

from kit.vmproject import (
    Kept,
    chunks,
    clean,
    flip,
    last,
    listed,
    mem,
    memory_project,
    project_pool,  # noqa: F401  (the fixture `pool`)
    settled,
    shared_project,
    sleepers,
    start_sleeper,
    steps,
    teardown,
)

qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                          reason="QEMU is not installed (dev/run test installs it)")


@pytest.fixture
def vm(request, pool):
    yield from shared_project(request, pool, "store")


@pytest.fixture
def vm_own(tmp_path):
    e = memory_project(tmp_path)
    try:
        yield e
    finally:
        teardown(e)


# --- the chunk store: one damaged chunk, and the snapshots taken after it ----------------------

@qemu
def test_a_damaged_chunk_is_not_reused_by_a_snapshot_taken_after_it(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). A chunk that is on disk is never written
    again (memchunks.store: `if not os.path.exists(p)`), whatever its bytes: once one chunk
    is damaged (a flipped byte), every later snapshot whose stream holds the same bytes lists
    the damaged file and is committed (`ok`) as if whole. A rewind to such a later step then
    fails ("memory chunk ... is damaged") although its own stream was written correctly after
    the damage: one bad sector costs every snapshot from then on, not only the ones that had
    it."""
    vm.run("true", timeout=300)
    a = last(vm)
    vm.run("true")
    b = last(vm)
    assert settled(vm, a) and settled(vm, b)
    shared = [h for h in listed(vm, b) if h in set(listed(vm, a))]
    assert shared, "two idle steps share no chunk"
    for h in set(shared):               # every one: which of them the next stream holds again
        flip(chunks(vm) / h[:2] / h)    # depends on what the guest did meanwhile
    start_sleeper(vm, 4242)             # the step after the damage, with a process to bring back
    c = last(vm)
    assert settled(vm, c)
    again = set(shared) & set(listed(vm, c))
    assert again, "precondition: the later stream holds a damaged chunk's bytes"
    h = sorted(again)[0]
    vm.run("pkill -x sleep; true")
    assert sleepers(vm, 4242) == 0
    r = vm.envgit("rewind", str(c), "--yes", timeout=180)
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" in r.stdout, (
        f"step {c}'s snapshot, taken after chunk {h} was damaged, lists the damaged file:\n{r.stdout}")
    assert sleepers(vm, 4242) == 1


# --- meta.json damaged ---------------------------------------------------------------------------

@qemu
def test_a_damaged_meta_of_the_newest_snapshot_does_not_stop_every_step(vm_own):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). The newest complete snapshot's meta.json
    does not parse (a torn or flipped file): a new daemon resumes the machine from it, and
    host.py's `ensure` reads meta.json outside the try that falls back to a boot: every step of
    the project then fails with exit 125, "the VM could not start: Expecting value: line 1
    column 11 (char 10)", until the person finds and removes the directory by hand. Expected:
    the damaged snapshot is skipped (said), the VM boots (or resumes an older one) and the step
    runs."""
    vm = vm_own
    vm.run("true", timeout=300)
    a = last(vm)
    assert settled(vm, a)
    vm.stop()
    (mem(vm, a) / "meta.json").write_text('{"setup": tru')
    r = vm.run("echo still-runs", timeout=300)
    clean(r)
    assert r.returncode == 0 and "still-runs" in r.stdout, r.stdout + r.stderr


# --- the step rewound to: its list of chunks or its meta.json damaged ---------------------------

def _flip_list(at):
    def damage(lst: Path):
        text = lst.read_text()
        lines = text.splitlines()
        n = len(lines) // 2
        flip(lst, {"hash": lambda: text.index(lines[n]) + 10,
                   "length": lambda: text.index(lines[n]) + len(lines[n]) - 1,
                   "header": lambda: 3}[at]())
    return damage


def _drop_a_line(lst: Path):
    lines = lst.read_text().splitlines()
    del lines[len(lines) // 2]
    os.chmod(lst, 0o600)
    lst.write_text("\n".join(lines) + "\n")


def _flipped_list_case(at):
    """Held: a byte flipped in memory.chunks (a hash, a length, the header) is found by fsck
    and the rewind says the memory was not restored, without a Python exception; the guest's
    process is not brought back."""
    def case(vm, a):
        _flip_list(at)(mem(vm, a) / "memory.chunks")
        r = vm.envgit("fsck")
        clean(r)
        assert r.returncode != 0 and f"memory snapshot of step {a} is damaged" in r.stdout, r.stdout
        r = vm.envgit("rewind", str(a), "--yes", timeout=180)
        clean(r)
        assert r.returncode == 0 and "memory was not restored" in r.stdout, r.stdout + r.stderr
        assert "memory and processes are back" not in r.stdout
        assert sleepers(vm, 4444) == 0
    return case


def _list_missing_a_line(vm, a):
    """HOLE at 92d25d9 + the page-record cut (fixed at 9d0db0d: meta.json keeps the list's
    BLAKE3). One line taken out of the middle of memory.chunks (every chunk it still names is
    whole): fsck said "ok" and the rewind "the VM's memory and processes are back", a guest
    resumed with those pages as zeros. Nothing bound the list to the stream it was cut from:
    meta.json records the stream's `bytes` and `chunks`, which neither the restore
    (qemu.restore / memchunks.stream_into) nor fsck (memchunks.verify) compared, and the
    record-aligned cut leaves a stream missing whole chunks one QEMU loads without a word. A
    torn list, or one copied over from another step, resumed a wrong guest the same way."""
    _drop_a_line(mem(vm, a) / "memory.chunks")
    r = vm.envgit("fsck")
    clean(r)
    fsck_found = r.returncode != 0 and f"step {a}" in r.stdout
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" not in r.stdout, (
        "a list missing a chunk was restored as the step's memory:\n" + r.stdout)
    assert fsck_found, "fsck found nothing wrong with a list missing a chunk"


def _torn_meta(vm, a):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d). meta.json of the step rewound to does not
    parse: host.rewind caught VMError and OSError only, the JSONDecodeError (a ValueError) from
    memstore.read_meta escaped, the CLI printed "envgit daemon: JSONDecodeError: Unterminated
    string ..." with exit 1, and the rewind step begun in the journal was never ended (`envgit
    log` showed it running for ever). The preview said "the VM's memory and processes come
    back" (it looks at `ok` only). Expected: the files rewound, "memory was not restored" and
    why, the rewind step ended."""
    meta = mem(vm, a) / "meta.json"
    meta.write_text(meta.read_text()[:100])
    vm.run("true")
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory was not restored" in r.stdout, r.stdout
    rewinds = [s for s in steps(vm) if "rewind" in (s.get("marks") or []) and s["id"] > a]
    assert rewinds and all(s.get("exit_code") is not None for s in rewinds), rewinds
    for cmd in (("fsck",), ("show", str(a))):
        clean(vm.envgit(*cmd))


def _meta_without_hashes_and_a_list_missing_a_line(vm, a):
    """HOLE at 464c456 (a blind attack on the postcopy restore): a meta.json that lost its
    list_hash and pages_hash (one flipped bit in a key's name does it), with a line taken out
    of the list: the missing hash was taken as "written before hashes were kept", the whole
    stream was restored with eight pages of a process as zeros, "memory and processes are
    back", and fsck said ok. Expected: no hash, no restore; fsck names the step."""
    meta = mem(vm, a) / "meta.json"
    got = json.loads(meta.read_text())
    for key in ("list_hash", "pages_hash"):
        got.pop(key, None)
    meta.write_text(json.dumps(got))
    _drop_a_line(mem(vm, a) / "memory.chunks")
    r = vm.envgit("fsck")
    clean(r)
    assert r.returncode != 0 and f"memory snapshot of step {a} is damaged" in r.stdout, r.stdout
    r = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(r)
    assert "memory was not restored" in r.stdout and "memory and processes are back" not in r.stdout, \
        r.stdout + r.stderr


def _meta_of_wrong_kinds(text):
    """HOLE at 464c456 (the same attack): a meta.json that parses but holds a list, or a
    number as a string: fsck printed a traceback, and a rewind to it succeeded and copied the
    meta into the rewind step, after which every step's end failed with a bare TypeError and
    `envgit run` said nothing. Expected: fsck names it, the rewind says not restored."""
    def case(vm, a):
        meta = mem(vm, a) / "meta.json"
        meta.write_text(text(meta.read_text()))
        r = vm.envgit("fsck")
        clean(r)
        assert r.returncode != 0 and f"memory snapshot of step {a} is damaged" in r.stdout, r.stdout
        r = vm.envgit("rewind", str(a), "--yes", timeout=180)
        clean(r)
        assert "memory was not restored" in r.stdout, r.stdout + r.stderr
        r = vm.run("echo next-step-ends", timeout=300)
        clean(r)
        assert r.returncode == 0 and "next-step-ends" in r.stdout, r.stdout + r.stderr
    return case


DAMAGED = {
    "a flipped byte in a chunk list: a hash": _flipped_list_case("hash"),
    "a flipped byte in a chunk list: a length": _flipped_list_case("length"),
    "a flipped byte in a chunk list: the header": _flipped_list_case("header"),
    "a chunk list missing a line": _list_missing_a_line,
    "a torn meta.json": _torn_meta,
    "a meta.json without its hashes, and a list missing a line": _meta_without_hashes_and_a_list_missing_a_line,
    "a meta.json that is a list": _meta_of_wrong_kinds(lambda text: "[1]"),
    "a meta.json with memory_mb a string": _meta_of_wrong_kinds(
        lambda text: json.dumps({**json.loads(text), "memory_mb": str(json.loads(text)["memory_mb"])})),
}


@qemu
def test_a_damaged_list_or_meta_of_the_step_rewound_to_is_said_and_never_resumed(vm):
    """Each case (DAMAGED; its docstring says what it found) damages the snapshot of one step A
    that left `sleep 4444` running, checks fsck and a rewind to A, then puts A's files back as
    they were: fsck is clean again before the next case, so what a case finds is its own
    damage, and no case's rewind brought the process back (none runs once the first case
    begins). Once all have run, a rewind to A as written brings it back: the oracle sees a
    restore when there is one."""
    start_sleeper(vm, 4444)
    a = last(vm)
    assert settled(vm, a)
    vm.run("pkill -x sleep; true")
    failed = {}
    for name, case in DAMAGED.items():
        kept = [Kept(mem(vm, a) / f) for f in ("memory.chunks", "meta.json")]
        try:
            case(vm, a)
        except AssertionError as e:
            failed[name] = str(e)
        finally:
            for k in kept:
                k.put_back()
        r = vm.envgit("fsck")
        if r.returncode != 0:
            failed[f"{name}: A's files put back"] = f"fsck is not clean again:\n{r.stdout}{r.stderr}"
            break
    else:
        r = vm.envgit("rewind", str(a), "--yes", timeout=180)
        clean(r)
        if "memory and processes are back" not in r.stdout or sleepers(vm, 4444) != 1:
            failed["the rewind to A whole"] = r.stdout + r.stderr
    assert not failed, "\n\n".join(f"{name}: {why}" for name, why in failed.items())


POWER_OFF_ON_TRIGGER = """import os, time
while not os.path.exists("power-off-now"):
    time.sleep(0.1)
open("/proc/sysrq-trigger", "w").write("o")
"""


@qemu
def test_memory_that_powers_its_guest_off_once_restored_does_not_stop_every_later_step(vm):
    """HOLE at 464c456 (the blind attack). A step leaves a process that powers the guest off
    (the attack waited for the clock's jump after a restore; here, for a file, to be certain
    when); a later step stops it, and the person rewinds to the first, which brings it back.
    It powers the guest off in the next step; every step after resumed the same memory from
    the rewind step's snapshot and failed, "the VM is not running", exit 125, until the person
    rewound to an earlier step. Expected: memory that stopped its guest before a step ended in
    it is not resumed again; the VM boots afresh, said, and the steps run."""
    (vm.root / "power_off.py").write_text(POWER_OFF_ON_TRIGGER)
    r = vm.run("setsid python3 power_off.py >/dev/null 2>&1 < /dev/null & echo planted", timeout=300)
    assert "planted" in r.stdout, r.stdout + r.stderr
    a = last(vm)
    assert settled(vm, a)
    vm.run("pkill -f '[p]ower_off.py'; true", timeout=300)
    rw = vm.envgit("rewind", str(a), "--yes", timeout=180)
    clean(rw)
    assert "memory and processes are back" in rw.stdout, rw.stdout + rw.stderr
    (vm.root / "power-off-now").write_text("")
    try:
        clean(vm.run("sleep 3; echo powered-off-meanwhile", timeout=300))
        ran = [vm.run("echo still-runs", timeout=300) for _ in range(2)]
        for r in ran:
            clean(r)
        assert all(r.returncode == 0 and "still-runs" in r.stdout for r in ran), \
            "\n".join(r.stdout + r.stderr for r in ran) + vm.envgit("log").stdout
        said = "".join(r.stderr for r in ran)
        assert f"brought back from step {a}'s memory stopped before a step ended in it" in said, said
    finally:
        (vm.root / "power-off-now").unlink()
        (vm.root / "power_off.py").unlink()


# --- what else may be found in the chunk store ----------------------------------------------------

@qemu
def test_a_stray_file_in_the_chunk_store_breaks_neither_gc_nor_stats(vm):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d) (robustness; no step can put it there:
    .envgit is hidden from steps). A regular file directly under .envgit/vm/chunks (a
    `.DS_Store`, a note, a backup tool's marker): `envgit stats` exited 1 with "envgit: Not a
    directory: .../chunks/README" and `envgit gc` with "envgit daemon: NotADirectoryError:
    [Errno 20] ...", after gc had already dropped the steps' file snapshots and written gc-done
    (memchunks.sweep and usage listed every entry of the store as a directory)."""
    vm.run("true", timeout=300)
    assert settled(vm, last(vm))
    stray = chunks(vm) / "README"
    stray.write_text("a note\n")
    try:
        r = vm.envgit("stats")
        clean(r)
        assert r.returncode == 0, r.stdout + r.stderr
        r = vm.envgit("gc", "--keep-last", "1", timeout=180)
        clean(r)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        stray.unlink(missing_ok=True)


@qemu
def test_gc_never_removes_files_outside_the_chunk_store(vm, tmp_path):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d) (needs write access to .envgit, which no
    step has). A prefix directory of the store that is a symlink (`chunks/zz -> victim`, as a
    person moving part of the store to another disk would make it): gc's sweep listed it as a
    directory of chunks and removed every file in the target that no snapshot lists: the
    victim's precious.txt was deleted. sweep (and usage) followed the link: os.listdir of the
    joined path, no lstat / O_NOFOLLOW check."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me\n")
    vm.run("true", timeout=300)
    assert settled(vm, last(vm))
    link = chunks(vm) / "zz"
    link.symlink_to(victim)
    try:
        r = vm.envgit("gc", "--keep-last", "1", timeout=180)
        clean(r)
        assert (victim / "precious.txt").exists(), "gc deleted a file outside the chunk store"
    finally:
        link.unlink(missing_ok=True)


# --- durability of a committed snapshot ----------------------------------------------------------

def test_a_committed_snapshot_has_its_chunks_and_list_on_disk(tmp_path, monkeypatch):
    """HOLE at 5377991/92d25d9 (fixed at 9d0db0d): syncfs before meta.json and `ok` (power
    loss, not kill -9). What host.py's `finished` does once QEMU's stream is whole:
    memchunks.store (chunks written under a temporary name and renamed, then the list), then
    memstore.commit (meta.json fsynced, the directory fsynced, `ok`). Neither a chunk nor the
    list was fsynced, nor the store's directories: after a power cut the durable `ok` and
    meta.json could stand beside an empty list or empty chunks. memstore's docstring says `ok`
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
                       if ident(p) not in synced and ident(p)[0] not in whole and "all" not in whole})
    assert not unsynced, f"committed (ok) with {len(unsynced)} files/directories never fsynced: {unsynced[:4]}"
