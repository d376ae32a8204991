"""One daemon lifetime through thousands of steps: its descriptors, its memory and its cost per
step stay flat, and no snapshot fails. SOAK_STEPS steps (5,000 here; `ENVGIT_SOAK_STEPS=100000
dev/run test tests/test_daemon_soak.py` is the long version), each a real `begin` and `end` on
the daemon's socket around a file written in the project, as every step's client sends them:
the sandbox a step's command runs in is started by the client, not the daemon, so what the
daemon keeps per step is all here (a real `envgit run` step is mixed in every CHECK steps).

The curve (steps, descriptors, resident KiB, median wall ms per step and the daemon's CPU ms per
step over the window) is printed and,
with ENVGIT_SOAK_OUT=FILE, written as JSON lines."""

import json
import os
import statistics
import time

from envgit.daemon.client import connect
from envgit.paths import Project

SOAK_STEPS = int(os.environ.get("ENVGIT_SOAK_STEPS", "5000"))
CHECK = 500
WARM = 1000                     # the curve's reference point: caches full, the journal warm
# What the daemon may keep per step: the store keeps every object ever stored in memory (a step
# that writes new content adds a blob, a tree and a pack). tracemalloc over 2,000 such steps
# (2026-12-06): 930 bytes of Python heap a step, all of it the store's: the index entry and id
# of each object, its entry in the pack's list (pack_entries: what repack, heal and scrub
# walk), the pack's id. Resident memory adds malloc's own (a soak here: 1,250-1,500 bytes a
# step), and grows by whole arenas, so the bound leaves room; nothing else may grow with
# the number of steps.
BYTES_PER_STEP = 2048


def _sample(pid):
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return fds, rss


def _cpu_s(pid):
    """The daemon's CPU time so far (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settled_fds(pid, limit, wait=10.0):
    """The daemon's descriptors once the step just ended has let go of its own: a sample can
    land while a client's connection or a step's log is still open (other tests run beside this
    one), so sample again for up to `wait` seconds and keep the lowest. A leak stays; a step
    in flight does not."""
    lowest = _sample(pid)[0]
    deadline = time.monotonic() + wait
    while lowest > limit and time.monotonic() < deadline:
        time.sleep(0.2)
        lowest = min(lowest, _sample(pid)[0])
    return lowest


def test_a_daemon_stays_flat_through_thousands_of_steps(proj):
    root = str(proj.root)
    pid = json.loads(proj.envgit("daemon", "status", check=True).stdout)["pid"]   # started as the person
    conn = connect(Project(root), start=False)
    curve, took = [], []
    written = {}
    cpu_at, steps_at = _cpu_s(pid), 0
    for i in range(1, SOAK_STEPS + 1):
        if i % CHECK == 0:          # a real step through the CLI and the sandbox now and then
            t0 = time.perf_counter()
            r = proj.run(f"echo real {i} > real")
            took.append(time.perf_counter() - t0)
            assert r.returncode == 0, r.stderr
            fds, rss = _sample(pid)
            ms = statistics.median(took[-CHECK:]) * 1000
            cpu = _cpu_s(pid)
            cpu_ms = (cpu - cpu_at) * 1000 / (i - steps_at)
            cpu_at, steps_at = cpu, i
            curve.append({"steps": i, "fds": fds, "rss_kib": rss, "ms_per_step": round(ms, 2),
                          "daemon_cpu_ms_per_step": round(cpu_ms, 2)})
            print(json.dumps(curve[-1]), flush=True)
            continue
        t0 = time.perf_counter()
        begun = conn.request({"op": "begin", "argv": ["sh", "-c", f"echo {i} > f{i % 7}"],
                              "cwd": root, "env": {}, "pid": os.getpid(), "uid": os.getuid(),
                              "session": None, "tool_call_id": None})
        assert "step" in begun, begun
        name = f"f{i % 7}"
        with open(os.path.join(root, name), "w") as f:
            f.write(f"{i}\n")
        ended = conn.request({"op": "end", "step": begun["step"], "exit_code": 0, "duration_ms": 1,
                              "signal": None, "dns": None})
        assert "error" not in ended, ended
        took.append(time.perf_counter() - t0)
        written[begun["step"]] = (name, f"{i}\n")
    conn.close()
    if out := os.environ.get("ENVGIT_SOAK_OUT"):
        with open(out, "w") as f:
            f.writelines(json.dumps(c) + "\n" for c in curve)
    ref = next(c for c in curve if c["steps"] >= WARM)
    end = curve[-1]
    settled = _settled_fds(pid, ref["fds"] + 3)
    assert settled - ref["fds"] <= 3, (settled, curve)
    grown = (end["rss_kib"] - ref["rss_kib"]) * 1024 / max(1, end["steps"] - ref["steps"])
    assert grown <= BYTES_PER_STEP, (grown, curve)
    # the cost per step: the daemon's CPU time per step over the last window against the warm
    # one. CPU time, not wall time: the tests running beside this one stretch a step's wall
    # time by whatever they happen to do in each window, but not the daemon's own work.
    assert end["daemon_cpu_ms_per_step"] <= 2 * ref["daemon_cpu_ms_per_step"] + 2, curve
    # no step lost its snapshot, and the steps' trees are the ones written
    steps = json.loads(proj.envgit("log", "--json", check=True, timeout=300).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    assert len(steps) >= SOAK_STEPS
    assert not [s["id"] for s in steps if "snapshot-failed" in s["marks"] or not (s["snapshot"] or {}).get("tree")]
    middle = sorted(written)[len(written) // 2]
    r = proj.envgit("rewind", "-y", str(middle), timeout=300)
    assert r.returncode == 0, r.stderr
    name, text = written[middle]
    assert (proj.root / name).read_text() == text
