"""The VM tier (backend: vm), end to end: real QEMU (TCG on this machine: /dev/kvm is nested
kvm-pvm), the real guest image built from Debian packages, the real `envgit run` (pipes and a
real pseudo-terminal), rewind, gc and fsck through the CLI.

One project and one booted VM for the whole module (a boot under TCG costs 10-40 s on this
shared machine); the tests run in file order and build on each other's steps. The guest image
is cached once per machine (ENVGIT_VM_CACHE, the real user's ~/.cache/envgit/vm) since each
test home is new. Total on this machine: about 2-3 minutes.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CANARY, ENVGIT
from kit.vmproject import vm_project

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")


COUNTER = r'''
import http.server, os, random
n = 0
r = random.random()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        body = f"{os.getpid()} {r} {n}\n".encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8000), H).serve_forever()
'''


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    e = vm_project(tmp_path_factory.mktemp("vm"))
    root = e.root
    (root / "counter.py").write_text(COUNTER)
    (root / ".env").write_text(f"TOKEN={CANARY}\n")
    (root / "notes.txt").write_text("from the host\n")
    yield e
    e.stop()


def _steps(e):
    return json.loads(e.envgit("log", "--json", check=True).stdout)


def _daemon_alive(e) -> bool:
    import fcntl
    with open(e.root / ".envgit" / "daemon.lock", "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
        return False


def _get(e, path="inc"):
    r = e.envgit("run", "--", "wget", "-qO-", f"http://127.0.0.1:8000/{path}", timeout=120)
    assert r.returncode == 0, r.stderr
    pid, value, n = r.stdout.split()
    return int(pid), value, int(n)


def test_boot_a_step_its_streams_and_exit_status(vm):
    t0 = time.monotonic()
    r = vm.run("cat notes.txt; echo to-stderr >&2; echo made-in-guest > made.txt; "
               "test -e /dev/kvm || true; exit 7", timeout=300)
    boot_s = time.monotonic() - t0
    assert r.returncode == 7, r.stderr
    assert r.stdout == "from the host\n"
    assert "to-stderr" in r.stderr
    assert "TCG" in r.stderr or "KVM" in r.stderr or "booted" in r.stderr     # the cost is said
    assert (vm.root / "made.txt").read_text() == "made-in-guest\n"       # back on the host
    print(f"first step (boot included): {boot_s:.1f} s")
    # stdin reaches the command; a death by signal is the shell's 128+N
    r = vm.envgit("run", "--", "sh", "-c", "tr a-z A-Z", input="piped in\n")
    assert r.returncode == 0 and r.stdout == "PIPED IN\n"
    r = vm.run("kill -TERM $$")
    assert r.returncode in (-15, 143), (r.returncode, r.stderr)
    r = vm.envgit("run", "--", "no-such-command-here")
    assert r.returncode == 127
    # a real terminal: the guest's command gets a pty of its own, and its status
    status, out = vm.pty_run(["sh", "-c", "tty; test -t 0 && echo interactive; exit 3"], timeout=120)
    assert os.waitstatus_to_exitcode(status) == 3, out
    assert "/dev/pts/" in out and "interactive" in out
    # the memory snapshot is written in the background: its size is said once it is whole
    deadline = time.monotonic() + 120
    while True:
        show = vm.envgit("show", "last", check=True).stdout
        if re.search(r"memory\s+[\d.]+ MB .* paused \d+ ms", show) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert re.search(r"memory\s+[\d.]+ MB .* paused \d+ ms", show), show
    assert "method: background-snapshot" in show, show
    # its stream's pages that did not change since the steps before it are their chunks: a
    # small share of it is new (7-8 % measured for an idle guest)
    meta = json.loads((vm.root / ".envgit" / "vm" / "mem" / str(_steps(vm)[-1]["id"]) / "meta.json").read_text())
    assert meta["format"] == "chunks" and 0 < meta["stored"] < meta["bytes"] / 2, meta


def test_a_typed_session_in_the_guest(vm):
    """A person types into an interactive program in the guest: Python's REPL on the guest's
    pty, line editing and all, through the caller's terminal in raw mode."""
    status, out = vm.pty_run(["python3", "-q"], send=b"x = 6 * 7\nprint('answer', x)\nexit(5)\n",
                             when=b">>>", timeout=120)
    assert "answer 42" in out, out
    assert os.waitstatus_to_exitcode(status) == 5, out


def test_a_signal_sent_to_envgit_run_reaches_the_command_in_the_guest(vm):
    p = subprocess.Popen([str(Path(sys.executable).parent / "envgit"), "run", "--", "sh", "-c",
                          "trap 'echo got-term; exit 9' TERM; echo started; while :; do sleep 0.2; done"],
                         cwd=vm.root, env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "started\n"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert "got-term" in out and p.returncode == 9, (out, err, p.returncode)


def test_the_guest_sees_the_project_and_its_own_root_only(vm):
    home = str(vm.home)
    r = vm.run(f"cat .env; cat {home}/.ssh/id_ed25519; cat {home}/.aws/credentials; ls {home}; "
               "ls -a; cat /proc/net/dev; grep -rs " + CANARY + " /root /tmp /etc . ; echo done")
    assert CANARY not in r.stdout + r.stderr
    assert "done" in r.stdout
    assert "notes.txt" in r.stdout and ".env" not in r.stdout.split()      # denied: not there at all
    assert ".envgit" not in r.stdout.split()                               # envgit's state neither
    assert "lo:" in r.stdout and "eth0" not in r.stdout                    # no NIC but loopback
    # a denied path written in the guest never lands on the host
    r = vm.run("echo planted > .env; echo x >> envgit.yaml; echo ok")
    assert (vm.root / ".env").read_text() == f"TOKEN={CANARY}\n"
    policy = (vm.root / "envgit.yaml").read_text()
    assert "backend: vm" in policy and "\nx\n" not in policy


def test_rewind_brings_back_the_process_with_its_memory_and_undo_goes_forward(vm):
    r = vm.run("python3 counter.py >/dev/null 2>&1 & "
               "for i in $(seq 1 100); do wget -qO- http://127.0.0.1:8000/peek >/dev/null 2>&1 && exit 0; "
               "sleep 0.2; done; exit 1", timeout=120)
    assert r.returncode == 0, r.stderr
    pid, value, n0 = _get(vm)
    step_at = _steps(vm)[-1]["id"]          # the end of this step: counter at n0
    pid2, value2, n1 = _get(vm)
    pid3, value3, n2 = _get(vm)
    assert (pid2, value2, n1, n2) == (pid, value, n0 + 1, n0 + 2)
    r = vm.envgit("rewind", str(step_at), "--yes", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" in r.stdout
    after = _get(vm)
    assert after == (pid, value, n0 + 1)    # same process, same random value, counter from the snapshot
    # undo: forward again, to where the rewind started (the counter at n2, then n2+1)
    r = vm.envgit("rewind", "--undo", "--yes", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _get(vm) == (pid, value, n2 + 1)
    # the steps record it: the rewind says where its memory came from
    rewinds = [s for s in _steps(vm) if "rewind" in s["marks"]]
    assert rewinds and all(s["memory"]["restored"] for s in rewinds[-2:])


HOLDER = r'''
import hashlib, http.server, os
buf = bytearray(os.urandom(1 << 20) * 48)             # 48 MiB, each MiB the same random bytes
for i in range(0, len(buf), 4096):
    buf[i:i + 8] = i.to_bytes(8, "little")             # and every page its own
kept = hashlib.sha256(buf).hexdigest()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{kept} {hashlib.sha256(buf).hexdigest()}\n".encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", 8001), H).serve_forever()
'''


def test_a_rewind_runs_the_guest_before_its_memory_is_read_and_every_page_comes_back(vm):
    """A step's snapshot keeps where each page is in its stream (memory.pages): a rewind starts
    the guest once its device state is loaded and sends the pages it asks for first, the rest
    meanwhile (postcopy.py). A process holding 48 MiB it checksummed when it filled them finds
    them whole after the rewind, and the rewind says which way its memory came back."""
    (vm.root / "holder.py").write_text(HOLDER)
    r = vm.run("python3 holder.py >/dev/null 2>&1 & "
               "for i in $(seq 1 150); do wget -qO- http://127.0.0.1:8001/ >/dev/null 2>&1 && exit 0; "
               "sleep 0.2; done; exit 1", timeout=180)
    assert r.returncode == 0, r.stderr
    before = vm.envgit("run", "--", "wget", "-qO-", "http://127.0.0.1:8001/", timeout=120).stdout.split()
    assert len(before) == 2 and before[0] == before[1], before
    at = _steps(vm)[-1]["id"]
    for _ in range(600):                    # its memory snapshot whole, with its page index
        if (vm.root / ".envgit" / "vm" / "mem" / str(at) / "ok").exists():
            break
        time.sleep(0.1)
    assert (vm.root / ".envgit" / "vm" / "mem" / str(at) / "memory.pages").stat().st_size > 0
    assert vm.run("pkill -f '[h]older.py'; echo gone").returncode == 0
    r = vm.envgit("rewind", str(at), "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory and processes are back" in r.stdout, r.stdout
    after = vm.envgit("run", "--", "wget", "-qO-", "http://127.0.0.1:8001/", timeout=120).stdout.split()
    assert after == before, (before, after)         # the same process, every page as it was
    memory = [s for s in _steps(vm) if "rewind" in s["marks"]][-1]["memory"]
    assert memory["restored"] is True and memory["ram"] == "postcopy", memory
    assert vm.envgit("fsck").returncode == 0


def test_a_rewind_to_a_step_whose_memory_is_being_written_waits_for_it(vm, tmp_path):
    """The step's end waits only for the guest's pause; its memory is written while the next
    command runs. Held at the point where the stream is whole (ENVGIT_FAULT pause), a rewind to
    that step waits, then brings back the process as the step left it."""
    vm.envgit("daemon", "stop")
    held = {"ENVGIT_FAULT": "vm-memory-written:pause", "ENVGIT_FAULT_DIR": str(tmp_path)}
    r = vm.envgit("run", "--", "wget", "-qO-", "http://127.0.0.1:8000/inc", env=held, timeout=300)
    assert r.returncode == 0, r.stderr
    pid, value, n = map(str.strip, r.stdout.split())
    step = _steps(vm)[-1]
    assert step["memory"]["background"] is True and step["memory"]["pause_ms"] >= 0, step["memory"]
    flag = tmp_path / "vm-memory-written.paused"
    for _ in range(300):
        if flag.exists():
            break
        time.sleep(0.1)
    assert flag.exists(), "the background snapshot never reached its point"
    rewind = subprocess.Popen([ENVGIT, "rewind", str(step["id"]), "--yes"],
                              cwd=vm.root, env=vm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    time.sleep(3)
    assert rewind.poll() is None, rewind.communicate()      # waiting for the snapshot
    flag.unlink()
    out, err = rewind.communicate(timeout=180)
    assert rewind.returncode == 0, out + err
    assert "memory and processes are back" in out, out
    assert _get(vm) == (int(pid), value, int(n) + 1)


def test_a_daemon_killed_during_a_memory_snapshot_leaves_the_earlier_ones(vm):
    before = _get(vm)
    last_good = _steps(vm)[-1]["id"]
    r = vm.envgit("daemon", "stop")
    # the stream written whole, then cut into chunks: killed before either is committed. The
    # step's end may be written first (its snapshot goes on in the background): the daemon
    # dies at the point either way, and the next command starts a new one
    for point in ("vm-memory-written", "vm-memory-chunked"):
        r = vm.envgit("run", "--", "true", env={"ENVGIT_FAULT": point}, timeout=300)
        for _ in range(600):           # until the daemon's lock is free: it died at the point
            if not _daemon_alive(vm):
                break
            time.sleep(0.1)
        assert not _daemon_alive(vm), f"{point} was not reached: {r.stderr}"
        mem = vm.root / ".envgit" / "vm" / "mem"
        killed = max(int(p.name) for p in mem.iterdir())
        assert not (mem / str(killed) / "ok").exists()          # left incomplete
        r = vm.envgit("fsck")
        assert r.returncode == 0, r.stdout + r.stderr           # fsck clean: incomplete is not damage
        assert "incomplete" in r.stdout
    # a new daemon resumes the machine from the newest complete snapshot: the process is there
    pid, value, n = _get(vm)
    assert (pid, value) == before[:2] and n == before[2] + 1
    assert _steps(vm)[-1]["memory"]["pause_ms"] >= 0
    assert _steps(vm)[-1]["memory"]["background"] is True
    assert last_good in [s["id"] for s in _steps(vm)]


def test_gc_removes_unreachable_memory_snapshots(vm):
    mem = vm.root / ".envgit" / "vm" / "mem"
    assert len(list(mem.iterdir())) > 2
    r = vm.envgit("gc", "--keep-last", "1", "--json", check=True)
    got = json.loads(r.stdout)
    assert got["memory_dropped"] and got["memory_freed"] > 0
    left = sorted(int(p.name) for p in mem.iterdir())
    # memory snapshots follow their steps: the last one, and those of the steps a rewind
    # stepped over, which gc keeps for their branch (r<R>) until `envgit branch rm`
    assert got["kept"][-1] in left and set(left) <= set(got["kept"]), (left, got["kept"])
    assert vm.envgit("fsck").returncode == 0
    # the kept one still brings the machine back after a restart
    before = _get(vm)
    vm.envgit("daemon", "stop")
    assert _get(vm)[:2] == before[:2]


def test_a_flipped_byte_in_a_memory_chunk_is_found_and_never_resumed(vm):
    """A step's memory is kept as chunks named by their hash: a byte flipped on disk is listed
    by fsck, and a rewind to that step brings its files back but not a guest resumed with a
    page that is not what was written, and says why. (A chunk a later stream holds again is
    written anew, healed: the one flipped here is the step's own.)"""
    _get(vm)
    step = _steps(vm)[-1]["id"]
    vm.run("true")
    later = _steps(vm)[-1]["id"]
    mem = vm.root / ".envgit" / "vm" / "mem"
    for _ in range(600):
        if (mem / str(later) / "ok").exists():
            break
        time.sleep(0.1)

    def listed(n):
        return [line.split()[0] for line in (mem / str(n) / "memory.chunks").read_text().splitlines()[1:]]
    own = [h for h in listed(step) if h not in set(listed(later))]
    assert own, "the step's stream has no chunk of its own"
    h = own[len(own) // 2]
    chunk = vm.root / ".envgit" / "vm" / "chunks" / h[:2] / h
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    r = vm.envgit("fsck")
    assert r.returncode != 0 and f"memory chunk {h} is damaged" in r.stdout + r.stderr, r.stdout + r.stderr
    r = vm.envgit("rewind", str(step), "--yes", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "memory was not restored" in r.stdout and f"memory chunk {h} is damaged" in r.stdout, r.stdout
    assert "memory and processes are back" not in r.stdout
