"""Journal read benchmark: what `envgit show`, `envgit log -n 10` and a daemon's start cost
against the number of steps in the journal, beside an anchor measured in the same run.

    .venv/bin/python bench/bench_journal.py [--sizes 100,1000,10000,100000] [--runs 15]

Each journal is built fast by direct appends through the Journal API (a begin, a request
and an end with a snapshot summary per step, one transaction each, as the daemon writes
them) in a fresh `envgit init` project. Then, as separate processes like a person runs them:
  show      `envgit show N` of the middle step
  log -n 10 `envgit log -n 10`
  daemon    `python -m envgit.daemon ROOT` started until its socket answers `status`, then
            stopped (what the first step after an idle-out waits for)
Anchors (same run, same interpreter): `envgit --help` (a process start that imports
envgit's CLI and reads nothing) for show/log; `python -m envgit.daemon` started on an
empty journal (the daemon's own start-up, journal-free) for the daemon. Figures are medians
of --runs runs, printed in ms and as ratios to their anchor; flat means the ratio does not grow
with the journal.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from envgit.daemon.client import DaemonError, connect  # noqa: E402
from envgit.journal import Journal  # noqa: E402
from envgit.paths import Project  # noqa: E402

ENVGIT = [sys.executable, "-m", "envgit"]
TREE = "7e007a746d37aafe6d90b7011894910db6fb7538c7de662acd5dbdaaf72438b5"   # the empty tree


def make_project(root: Path, steps: int) -> Project:
    root.mkdir(parents=True)
    subprocess.run(ENVGIT + ["init"], cwd=root, check=True, stdout=subprocess.DEVNULL)
    project = Project(str(root))
    j = Journal(project.journal)
    for i in range(steps):
        n = j.begin_step({"argv": ["sh", "-c", f"echo {i}"], "cwd": str(root), "session": "s-bench",
                          "user": "bench", "pid": 1000 + i, "policy_sha256": "0" * 64})
        j.append(n, "request", {"method": "GET", "scheme": "https", "host": "example.com", "port": 443,
                                "path": "/x", "status": 200, "decision": "allow", "rule": "bench"})
        j.append(n, "end", {"exit_code": 0, "signal": None, "duration_ms": 1.0, "marks": [],
                            "snapshot": {"tree": TREE, "added": 1, "modified": 0, "deleted": 0,
                                         "bytes": 10, "ms": 1.0, "paths": [{"path": f"f{i}", "status": "added"}]}})
    j.close()
    return project


def timed(argv, cwd) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t) * 1000


def daemon_start(project: Project) -> float:
    """Spawn the daemon, wait until it answers, stop it; the time to the answer."""
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-P", "-m", "envgit.daemon", project.root], cwd=project.root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = connect(project, start=False)
            conn.request({"op": "status"})
            break
        except (DaemonError, OSError):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"the daemon did not start in {project.root}") from None
            time.sleep(0.002)
    ms = (time.perf_counter() - t) * 1000
    conn.request({"op": "stop"})
    conn.close()
    proc.wait(timeout=30)
    return ms


def median(f, runs, *args) -> float:
    f(*args)                              # one warm-up (page cache, .pyc)
    return statistics.median(f(*args) for _ in range(runs))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000,100000")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="envgit-bench-journal-") as tmp:
        empty = make_project(Path(tmp) / "empty", 0)
        rows = []
        for n in sizes:
            t = time.perf_counter()
            p = make_project(Path(tmp) / f"p{n}", n)
            built = time.perf_counter() - t
            anchor = median(timed, args.runs, ENVGIT + ["--help"], p.root)
            d_anchor = median(daemon_start, args.runs, empty)
            show = median(timed, args.runs, ENVGIT + ["show", str(max(1, n // 2))], p.root)
            log = median(timed, args.runs, ENVGIT + ["log", "-n", "10"], p.root)
            daemon = median(daemon_start, args.runs, p)
            size = os.path.getsize(p.journal) + (os.path.getsize(p.journal + "-wal")
                                                 if os.path.exists(p.journal + "-wal") else 0)
            rows.append((n, size, anchor, show, log, d_anchor, daemon))
            print(f"# {n} steps built in {built:.1f} s", file=sys.stderr, flush=True)
    print(f"medians of {args.runs} runs, ms (ratio to the anchor beside it)")
    print(f"{'steps':>7} {'journal':>9} | {'--help':>9} {'show N':>14} {'log -n 10':>14} | "
          f"{'daemon@0':>9} {'daemon start':>14}")
    for n, size, anchor, show, log, d_anchor, daemon in rows:
        print(f"{n:>7} {size / 1e6:>7.1f}MB | {anchor:>9.1f} {show:>7.1f} ({show / anchor:.2f}x) "
              f"{log:>7.1f} ({log / anchor:.2f}x) | {d_anchor:>9.1f} {daemon:>7.1f} ({daemon / d_anchor:.2f}x)")


if __name__ == "__main__":
    main()
