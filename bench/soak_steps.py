"""Many real steps under load: every failure's cause recorded, the cost per step over the run.

    .venv/bin/python bench/soak_steps.py [--steps 20000] [--load 2] [--files 1000] [--out FILE]

Issue 31, item 6: one of 5,000 `envgit run true` failed once on a loaded machine, cause
unknown. This runs --steps real steps through the CLI and the sandbox (`envgit run -- sh -c
'echo I > fK'`, every tenth `envgit run -- true`) in a project of --files small files, while
--load processes spin on the CPU beside it (competing for both cores, as a test suite or a
build would). A step that exits other than 0 (or that takes over 120 s) is a failure: its
number, exit status, stderr, the daemon's pid before and after, and what daemon.log gained are
written to --out (JSON lines) and counted. Every 1,000 steps a line gives the median and 95th
percentile wall time over that window, the daemon's descriptors and resident memory: the cost
must stay flat.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVGIT = str(Path(sys.executable).parent / "envgit")
WINDOW = 1000
STEP_TIMEOUT_S = 120


def daemon_pid(root: Path):
    """The pid of the daemon serving `root` (its command line names it), or None."""
    want = [b"envgit.daemon", os.fsencode(root)]
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if all(w in argv for w in want):
                return int(name)
    return None


def sample(pid):
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return fds, rss
    except (OSError, StopIteration):
        return None, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--load", type=int, default=2, help="CPU-bound processes beside the steps")
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--out", default=None, help="JSON lines: each failure and each window")
    args = ap.parse_args()
    out = open(args.out, "w") if args.out else None

    def record(obj):
        print(json.dumps(obj), flush=True)
        if out:
            out.write(json.dumps(obj) + "\n")
            out.flush()

    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "proj"
        root.mkdir()
        for i in range(args.files):
            sub = root / f"d{i // 100}"
            sub.mkdir(exist_ok=True)
            (sub / f"f{i}.txt").write_text(f"{i}\n")
        env = {**os.environ, "HOME": d}
        subprocess.run([ENVGIT, "init"], cwd=root, env=env, check=True, capture_output=True)
        log = root / ".envgit" / "daemon.log"
        loaders = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
        failures, took, started = 0, [], time.monotonic()
        try:
            for i in range(1, args.steps + 1):
                argv = ["true"] if i % 10 == 0 else ["sh", "-c", f"echo {i} > f{i % 7}"]
                pid = daemon_pid(root)
                log_at = log.stat().st_size if log.exists() else 0
                t0 = time.perf_counter()
                try:
                    r = subprocess.run([ENVGIT, "run", "--", *argv], cwd=root, env=env,
                                       capture_output=True, timeout=STEP_TIMEOUT_S)
                    rc, err = r.returncode, r.stderr
                except subprocess.TimeoutExpired as e:
                    rc, err = "timeout", e.stderr or b""
                took.append(time.perf_counter() - t0)
                if rc != 0:
                    failures += 1
                    gained = b""
                    if log.exists():
                        with open(log, "rb") as f:
                            f.seek(log_at)
                            gained = f.read(8192)
                    record({"failure": i, "argv": argv, "exit": rc, "stderr": err.decode(errors="replace")[-2000:],
                            "daemon_before": pid, "daemon_after": daemon_pid(root),
                            "daemon_log": gained.decode(errors="replace"), "s": round(took[-1], 3)})
                if i % WINDOW == 0:
                    window = sorted(took[-WINDOW:])
                    fds, rss = sample(daemon_pid(root))
                    record({"steps": i, "median_ms": round(statistics.median(window) * 1000, 1),
                            "p95_ms": round(window[int(len(window) * 0.95)] * 1000, 1),
                            "failures": failures, "daemon_fds": fds, "daemon_rss_kib": rss,
                            "load1": round(os.getloadavg()[0], 2),
                            "elapsed_s": round(time.monotonic() - started)})
        finally:
            for p in loaders:
                p.kill()
                p.wait()
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
    print(f"{args.steps} steps with {args.load} CPU-bound processes beside them: {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
