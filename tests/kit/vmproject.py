"""A project on the VM tier for a test: a home of its own, `envgit init`, `backend: vm` with the
memory asked for, the guest image from the machine's shared cache (built once per machine).

Below it, what the attacks on the VM tier's memory snapshots share (tests/adversarial/
test_vm_background_attacks.py, test_vm_memory_damage.py, test_vm_memory_interrupted.py): a
project with a place for held fault points and tmpfs mounts, its teardown, one project shared
by the tests of a module that leave it sound (`shared_project`), and what the project holds (its
steps, memory snapshots, chunks) and what its guest runs (`sleep TAG` processes)."""

import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import Env, make_home

VM_CACHE = os.environ.get("ENVGIT_VM_CACHE") or "/var/tmp/envgit-test-vm-cache"

BARE_EXCEPTION = re.compile(r"Traceback|\b[A-Z][A-Za-z]*(Error|Exception)\b")

# Holds `MB` megabytes of non-zero memory (one random MiB repeated: QEMU writes every page),
# says so in /tmp/held, then sleeps: a big stream, so QEMU's background write takes a while.
HOLDER = r'''
import os, sys, time
b = bytearray(os.urandom(1 << 20)) * int(sys.argv[1])
with open("/tmp/held", "w") as f:
    f.write(str(os.getpid()))
time.sleep(10 ** 6)
'''


def vm_project(base, memory="256MiB") -> Env:
    home = make_home(base)
    root = home / "proj"
    root.mkdir()
    e = Env(home, root, {"ENVGIT_VM_CACHE": VM_CACHE, "ENVGIT_DAEMON_IDLE": "600"})
    e.envgit("init", check=True)
    with open(root / "envgit.yaml", "a") as f:
        f.write(f"backend: vm\nvm: {{ memory: {memory}, cpus: 1 }}\n")
    return e


# --- a project for the attacks on memory snapshots, and its teardown ----------------------------

def memory_project(base: Path, memory="256MiB") -> Env:
    e = vm_project(base, memory)
    e.flags = base / "flags"            # ENVGIT_FAULT_DIR: where a held point says it is held
    e.flags.mkdir()
    e.mounts = []
    return e


def daemon_pid(e):
    try:
        text = (e.root / ".envgit" / "daemon.log").read_text(errors="replace")
    except OSError:
        return None
    pids = re.findall(r"envgit daemon (\d+) serving", text)
    return int(pids[-1]) if pids else None


def daemon_alive(e) -> bool:
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


def teardown(e):
    for f in e.flags.iterdir():         # a held point lets go
        f.unlink()
    e.stop()
    deadline = time.monotonic() + 60
    while daemon_alive(e) and time.monotonic() < deadline:
        time.sleep(0.2)
    pid = daemon_pid(e)
    if daemon_alive(e) and pid:         # the daemon this test started (QEMU dies with it)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for m in reversed(e.mounts):
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


def sound(e) -> bool:
    """What the next test sharing the project needs: no point held, nothing mounted, the daemon
    started without a fault (one started with ENVGIT_FAULT is stopped by the test), and fsck
    clean (a test that damages a snapshot puts its bytes back)."""
    if any(e.flags.iterdir()) or e.mounts:
        return False
    r = e.envgit("fsck", timeout=180)
    return r.returncode == 0 and not BARE_EXCEPTION.search(r.stdout + r.stderr)


@pytest.fixture(scope="module", name="pool")
def project_pool():
    """The projects a module's tests share (shared_project), torn down at the module's end. A
    module imports it by this function's name; pytest finds it as `pool`:

        from kit.vmproject import project_pool  # noqa: F401  (the fixture `pool`)
    """
    kept: dict = {}
    yield kept
    for e in kept.values():
        teardown(e)


def shared_project(request, pool: dict, key: str, memory="256MiB"):
    """The project (and its guest) that the tests of a module asking for `key` share, built
    at the first (`pool`: the module's, whose fixture tears down what is left in it at the
    end): each such test makes steps of its own
    and leaves the project sound. One that failed, or left it unsound (`sound`), is torn down
    here, and the next test gets a new project: no test's outcome depends on another's."""
    e = pool.get(key)
    if e is None:
        e = pool[key] = memory_project(request.getfixturevalue("tmp_path_factory").mktemp(key), memory)
    failed = request.session.testsfailed
    yield e
    if request.session.testsfailed != failed or not sound(e):
        del pool[key]
        teardown(e)


def mount_tmpfs(e, path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root needed): {r.stderr.strip()}")
    e.mounts.append(path)


# --- what the project holds ----------------------------------------------------------------------

def steps(e):
    return json.loads(e.envgit("log", "--json", check=True).stdout)


def last(e) -> int:
    return steps(e)[-1]["id"]


def mem(e, step) -> Path:
    return e.root / ".envgit" / "vm" / "mem" / str(step)


def chunks(e) -> Path:
    return e.root / ".envgit" / "vm" / "chunks"


def settled(e, step, timeout=120) -> bool:
    """Wait until step's memory snapshot is no longer being written: True when committed."""
    d = mem(e, step)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (d / "ok").exists():
            return True
        if not d.exists():
            return False
        time.sleep(0.1)
    raise AssertionError(f"step {step}'s memory snapshot still being written after {timeout} s")


def listed(e, step) -> list[str]:
    return [line.split()[0] for line in (mem(e, step) / "memory.chunks").read_text().splitlines()[1:]]


def flip(path: Path, at=None):
    os.chmod(path, 0o600)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x01
    path.write_bytes(bytes(data))


class Kept:
    """A file's bytes and mode as they were, put back by `put_back` (a test that damages a
    snapshot of a shared project heals it)."""

    def __init__(self, path: Path):
        self.path, self.data, self.mode = path, path.read_bytes(), path.stat().st_mode & 0o7777

    def put_back(self):
        if self.path.parent.is_dir():
            os.chmod(self.path, 0o600)
            self.path.write_bytes(self.data)
            os.chmod(self.path, self.mode)


def clean(r):
    """No traceback, no bare Python exception in what the CLI said."""
    text = r.stdout + r.stderr
    assert not BARE_EXCEPTION.search(text), text


def wait_for(flag: Path, timeout=120):
    deadline = time.monotonic() + timeout
    while not flag.exists():
        assert time.monotonic() < deadline, f"{flag.name} was never reached"
        time.sleep(0.1)


# --- what the guest runs -------------------------------------------------------------------------

def start_sleeper(e, tag) -> None:
    """A process of the step's own that outlives it: `sleep <tag>` in a session of its own."""
    r = e.run(f"setsid sleep {tag} >/dev/null 2>&1 < /dev/null & echo started", timeout=300)
    assert r.returncode == 0 and "started" in r.stdout, r.stdout + r.stderr


def sleepers(e, *tags, then="true"):
    """How many processes in the guest have the command line `sleep TAG`, for each tag, counted
    in one step (procps' pgrep reads every /proc/PID/cmdline in one process: a loop forking a
    `tr` per process costs seconds under TCG); `then` runs after the count, in the same step.
    One tag: its count; several: a tuple."""
    count = "; ".join(f"echo n{t}=$(pgrep -c -x -f 'sleep {t}')" for t in tags)
    r = e.run(f"{count}; {then}; true", timeout=180)
    found = dict(re.findall(r"^n(\d+)=(\d+)$", r.stdout, re.M))
    assert r.returncode == 0 and set(found) == {str(t) for t in tags}, r.stdout + r.stderr
    counts = tuple(int(found[str(t)]) for t in tags)
    return counts[0] if len(tags) == 1 else counts
