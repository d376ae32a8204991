"""The first VM step without a boot (vm/kept.py): a guest booted once for an image is kept in
the image's cache and every later fresh start of the same machine restores it; what the kept
guest would share with every guest restored from it (its kernel's random state, its clock, its
project) is set per machine; a damaged kept guest is refused, booted anew and replaced.

Real QEMU (TCG here), the shared test image (ENVGIT_VM_CACHE), one project per daemon. The
memory size (224MiB) is this module's own, so no other module's kept guest is this one's. The
tests run in file order and build on each other.
"""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import Env, make_home

pytestmark = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None,
                                reason="QEMU is not installed (dev/run test installs it)")

VM_CACHE = os.environ.get("ENVGIT_VM_CACHE") or "/var/tmp/envgit-test-vm-cache"
MEMORY_MB = 224
DRAW = ("python3 -c 'import os, time; print(os.urandom(16).hex(), open(\"/proc/sys/kernel/random/uuid\")"
        ".read().strip(), time.time())'; cat notes.txt; pwd")


def _kept_dirs() -> list[Path]:
    out = []
    for meta in Path(VM_CACHE).glob("*/booted-*/meta.json"):
        try:
            if json.loads(meta.read_text()).get("memory_mb") == MEMORY_MB:
                out.append(meta.parent)
        except (OSError, ValueError):
            pass
    return out


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("vmboot")
    home = make_home(base)
    for d in _kept_dirs():                  # a kept guest of an earlier run: this one makes its own
        shutil.rmtree(d)
    made = []

    def project(name):
        root = home / name
        root.mkdir()
        e = Env(home, root, {"ENVGIT_VM_CACHE": VM_CACHE, "ENVGIT_DAEMON_IDLE": "300"})
        e.envgit("init", check=True)
        policy = (root / "envgit.yaml").read_text()      # a network, so the guest has the gate
        (root / "envgit.yaml").write_text(policy.replace("\n  allow: []\n", '\n  allow: ["allowed.example.test"]\n', 1))
        with open(root / "envgit.yaml", "a") as f:
            f.write(f"backend: vm\nvm: {{ memory: {MEMORY_MB}MiB, cpus: 1 }}\n")
        (root / "notes.txt").write_text(f"the notes of {name}\n")
        made.append(e)
        return e
    yield project
    for e in made:
        e.stop()


def _last(e) -> dict:
    return json.loads(e.envgit("show", "last", "--json", check=True).stdout)


def _first_step(e, script=DRAW):
    t0 = time.monotonic()
    r = e.run(script, timeout=400)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    e.stop()                            # one guest at a time on this shared machine
    return r, took


def test_a_second_project_restores_the_booted_guest_instead_of_booting(world):
    a = world("a")
    r, boot_s = _first_step(a, "echo booted")
    up = _last(a)["memory"]["came_up"]
    assert up["how"] == "booted" and up.get("kept") is True, up
    assert up["accel"] in ("tcg", "kvm")
    (kept,) = _kept_dirs()
    assert (kept / "ok").is_file() and not list(kept.parent.glob(".booted-*"))

    b = world("b")
    r, restore_s = _first_step(b, DRAW + "; echo made-in-guest > made.txt; "
                               "curl -s -m 30 -o /dev/null -w 'gate:%{http_code}\\n' "
                               "https://not-allowed.example.test/x; echo curl:$?")
    print(f"first step: booted {boot_s:.1f} s, from the kept boot {restore_s:.1f} s")
    step = _last(b)
    assert step["memory"]["came_up"]["how"] == "restored", step["memory"]
    assert step["memory"]["method"].startswith("background-snapshot")     # the step's own snapshot
    # the project's files pushed into the restored guest, in its own path, and written back
    assert "the notes of b\n" in r.stdout and f"{b.root}\n" in r.stdout
    assert (b.root / "made.txt").read_text() == "made-in-guest\n"
    assert "the VM started from the booted guest kept in the cache" in r.stderr
    # the guest's way out is the gate, which refuses a host the policy does not allow
    assert "gate:200" not in r.stdout and "curl:0" not in r.stdout, r.stdout
    assert "not-allowed.example.test, not in network.allow" in r.stderr
    assert any(q.get("host") == "not-allowed.example.test" and q.get("decision") == "deny"
               for q in step["requests"]), step["requests"]
    shown = b.envgit("show", "last", check=True).stdout
    assert "machine   restored from the booted guest kept in the cache" in shown, shown
    assert "method: background-snapshot" in shown, shown


def test_a_damaged_kept_boot_is_refused_booted_anew_and_replaced(world):
    (kept,) = _kept_dirs()
    before = json.loads((kept / "meta.json").read_text())["ram_crc32"]
    with open(kept / "ram", "r+b") as f:     # bytes flipped in a page the guest holds
        fd = f.fileno()
        off = os.lseek(fd, os.fstat(fd).st_size // 4, os.SEEK_DATA)
        data = os.pread(fd, 64, off)
        os.pwrite(fd, bytes(b ^ 0xFF for b in data), off)
    c = world("c")
    r, _ = _first_step(c)
    assert "the notes of c\n" in r.stdout
    up = _last(c)["memory"]["came_up"]
    assert up["how"] == "booted" and "damaged" in up.get("kept_failed", ""), up
    assert "the booted guest kept in the cache did not restore" in r.stderr, r.stderr
    shown = c.envgit("show", "last", check=True).stdout
    assert "machine   booted in " in shown and "the kept booted guest did not restore" in shown, shown
    (kept,) = _kept_dirs()
    meta = json.loads((kept / "meta.json").read_text())
    assert (kept / "ok").is_file() and meta["ram_crc32"] != before
    from envgit.vm import kept as kept_mod
    kept_mod.verify(str(kept))          # the replacement is whole


def test_two_restored_guests_draw_their_own_random_bytes_and_read_the_hosts_clock(world):
    (kept,) = _kept_dirs()
    age = time.time() - (kept / "ok").stat().st_mtime
    if age < 8:                         # a guest clock left at the snapshot's time would show
        time.sleep(8 - age)
    drawn = []
    for name in ("d", "e"):
        e = world(name)
        t_before = time.time()
        r, took = _first_step(e)
        assert _last(e)["memory"]["came_up"]["how"] == "restored"
        rand, uuid, t_guest = r.stdout.split("\n")[0].split()
        assert t_before - 1 < float(t_guest) < t_before + took + 1, (t_guest, t_before, took)
        assert f"the notes of {name}\n" in r.stdout and f"{e.root}\n" in r.stdout
        drawn.append((rand, uuid))
    assert drawn[0][0] != drawn[1][0] and drawn[0][1] != drawn[1][1], drawn
