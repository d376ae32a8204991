"""Red team 15: the guest agent's port, attacked from inside a VM step.

Every step runs as root in the guest, and the agent (pid 1) holds the virtio-serial port to the
daemon: `pidfd_getfd` hands a step's process a copy of that descriptor. A process a step leaves
running then reads the port itself, so the host's requests (SYNCED, RUN, COLLECT) go to it and
the agent never answers: every later step of the project waits out the daemon's timeouts (five
minutes for the sync-in, then "the VM could not start", exit 125) and the next one the same,
until the person rewinds to a step before it. The daemon checks that the QEMU process lives and
the port is open, never that the agent still answers (a ping with a short timeout), and a
memory snapshot keeps the thief for the next daemon to resume.

With the same descriptor a child of the step writes EXIT frames: the daemon takes the first
EXIT on the step's channel (channels are small counters: every one is tried) as the command's,
and `envgit run` reports and the journal records the forged status (the default tier's promise
"a step's child cannot turn a failure into success", test_exit_status_forgery.py).

Real QEMU (TCG here). The oracle: a later, harmless step's output within a bounded time.
"""

import json
import subprocess
import time

import pytest

pytestmark = pytest.mark.skipif(subprocess.run(["sh", "-c", "command -v qemu-system-x86_64"],
                                               capture_output=True).returncode != 0,
                                reason="QEMU is not installed (dev/run test installs it)")

THIEF = r'''
import ctypes, os, time
time.sleep(25)                              # after this step's write-back and memory snapshot
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(1), 3, 0)      # pidfd_getfd: the agent's port (its fd 3)
if fd < 0:
    fd = libc.syscall(438, os.pidfd_open(1), 4, 0)
open("/tmp/thief-fd", "w").write(str(fd))
while True:                                 # the host's frames, eaten
    os.read(fd, 1 << 16)
'''


def test_vm_a_step_that_steals_the_agents_port_does_not_stall_every_later_step(attacker, shared_image):
    attacker.stop()
    attacker.write_policy("version: 1\nbackend: vm\nvm: { memory: 256MiB, cpus: 1 }\n")
    attacker.env["ENVGIT_VM_CACHE"] = shared_image
    (attacker.root / "thief.py").write_text(THIEF)
    attacker.own(attacker.root / "thief.py")
    r = attacker.envgit("run", "--", "sh", "-c",
                        "python3 thief.py </dev/null >/dev/null 2>&1 & echo started", timeout=400)
    assert "started" in r.stdout, r.stdout + r.stderr
    time.sleep(35)                          # the thief has the port now
    t0 = time.monotonic()
    try:
        r = attacker.envgit("run", "--", "echo", "later-step", timeout=150)
        said = r.stdout + r.stderr
    except subprocess.TimeoutExpired:
        said = "(no answer in 150 s)"
    took = time.monotonic() - t0
    assert "later-step" in said and took < 150, (
        f"a process a VM step left running stalls the project's later steps ({took:.0f} s): {said}")


# A child of the step (a test helper, an install script) takes the agent's port and says on
# every channel the daemon may be waiting on that the command exited 0: the daemon's Link.run
# takes the first EXIT on the step's channel, whoever wrote it.
FORGE_EXIT = r'''
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(1), 3, 0)
frames = b"".join(struct.pack("!BII", 35, ch, 8) + struct.pack("!II", 0, 0) for ch in range(1, 4000))
view = memoryview(frames)
while view:
    view = view[os.write(fd, view):]
'''


def test_vm_a_steps_child_cannot_turn_a_failure_into_success(attacker, shared_image):
    attacker.stop()
    attacker.write_policy("version: 1\nbackend: vm\nvm: { memory: 256MiB, cpus: 1 }\n")
    attacker.env["ENVGIT_VM_CACHE"] = shared_image
    (attacker.root / "forge.py").write_text(FORGE_EXIT)
    attacker.own(attacker.root / "forge.py")
    r = attacker.envgit("run", "--", "sh", "-c", "python3 forge.py; sleep 3; exit 7", timeout=400)
    recorded = json.loads(attacker.envgit("show", "last", "--json").stdout).get("exit_code")
    assert (r.returncode, recorded) == (7, 7), (
        f"a VM step's child forged the exit status: envgit run said {r.returncode}, the journal "
        f"{recorded}, for a command that exits 7\n{r.stderr}")
