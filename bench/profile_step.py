"""Where the milliseconds of one step go (`envgit run true`, no network, a 10k-file project):
the client's own cost measured apart (interpreter start, its imports), the rest from a sampling
profile of the session daemon taken while the steps run (py-spy, every thread), grouped by what
the daemon was doing. docs/PERFORMANCE.md has the table this prints and how to read it.

    .venv/bin/pip install py-spy          # once; the profiler is not a dependency of envgit
    .venv/bin/python bench/profile_step.py [--runs N] [--files N]

Without py-spy it prints the client-side rows only. Samples are of the daemon's threads that
were running Python (idle threads are left out), so the daemon rows say where its busy time
went, not the step's wall time; the table puts them beside the step's wall time.
"""

import argparse
import collections
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import BARE, ENVGIT, make_project  # noqa: E402

PY = sys.executable

# What the daemon does for a step, by the function a sample is in (innermost match wins, so
# a snapshot's hashing is not counted again as the `end` op that called it).
GROUPS = [
    ("the end's snapshot: the stat pass and hashing", ("snapshot/", "snapshotter", "statcache", "walk")),
    ("journal writes (SQLite, the hash chain)", ("journal/",)),
    ("the sandbox's command line (view, masks, env)", ("sandbox/spec.py", "sandbox/view.py", "sandbox/kernel.py",
                                                       "sandbox/environ.py", "sandbox/projectscan.py")),
    ("policy loading and decisions", ("policy/",)),
    ("escape routes before and after (fingerprints, take-back)", ("sandbox/routes.py", "takeback", "routes")),
    ("the socket protocol (frames, JSON)", ("daemon/frames.py", "daemon/serve.py", "json/")),
    ("asyncio's loop", ("asyncio/",)),
]


def median_ms(argv, cwd, runs, env=None) -> float:
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=True)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def daemon_pid(root: Path) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"envgit.daemon" in cmd and str(root).encode() in cmd:
            return int(pid)
    return None


def profile_daemon(root: Path, runs: int) -> tuple[collections.Counter, int] | None:
    spy = shutil.which("py-spy") or str(Path(PY).parent / "py-spy")
    if not os.access(spy, os.X_OK):
        return None
    pid = daemon_pid(root)
    if pid is None:
        return None
    out = root.parent / "spy.txt"
    rec = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "1000", "--format", "raw",
                            "--threads", "--output", str(out), "--nonblocking"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)                     # attached
    for _ in range(runs):
        subprocess.run([ENVGIT, "run", "true"], cwd=root, capture_output=True, check=True)
    rec.send_signal(signal.SIGINT)       # py-spy writes what it has on Ctrl-C
    rec.wait(30)
    if not out.exists():
        return None
    counts: collections.Counter = collections.Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        frames = stack.split(";")
        group = "other (imports, the gate's idle loop, threads waiting)"
        for frame in reversed(frames):          # the innermost frame that names a group
            hit = next((g for g, keys in GROUPS if any(k in frame for k in keys)), None)
            if hit:
                group = hit
                break
        counts[group] += int(n)
    return counts, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--files", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-profile-") as tmp:
        root = Path(tmp) / "proj"
        root.mkdir()
        make_project(root, args.files)
        bare = median_ms(BARE, root, args.runs)
        step = median_ms([ENVGIT, "run", "true"], root, args.runs)
        interp = median_ms([PY, "-P", "-c", "pass"], "/", args.runs)
        client = median_ms([PY, "-P", "-c", "import envgit.run"], "/", args.runs)
        prof = profile_daemon(root, args.runs)
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, capture_output=True)
    print(f"one step, `envgit run true`, {args.files} files: {step:.1f} ms (median of {args.runs}); "
          f"bare bwrap {bare:.1f} ms (x{step / bare:.1f})")
    print(f"  the client's interpreter start       {interp:6.1f} ms")
    print(f"  the client's imports (envgit.run)    {client - interp:6.1f} ms")
    if prof is None:
        print("  the daemon: not profiled (pip install py-spy)")
        return
    counts, total = prof
    print(f"  the daemon, busy samples by what it was doing ({total} samples over {args.runs} steps, "
          f"{total / args.runs:.0f} ms of CPU a step at 1 kHz):")
    for group, n in counts.most_common():
        print(f"    {group:<58} {100 * n / total:5.1f} %  ~{n / args.runs:5.1f} ms a step")


if __name__ == "__main__":
    main()
