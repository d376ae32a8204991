"""Per-step cost of `envgit run true` beside bare bwrap (and srt, when it can be installed).

    .venv/bin/python bench/bench_run.py [--runs N] [--files N]

All three are timed in the same run, on a project of --files small files (default 10k), as
the median wall time of N runs (default 40), after a warm-up run that starts the daemon.
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVGIT = str(Path(sys.executable).parent / "envgit")
BARE = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-all", "true"]


def median_ms(argv, cwd, runs, env=None):
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True)      # warm-up
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True)
        times.append((time.perf_counter() - t) * 1000)
        if r.returncode != 0:
            raise SystemExit(f"{argv[0]} failed: {r.stderr.decode()[-500:]}")
    return statistics.median(times), min(times), max(times)


def make_project(root: Path, files: int):
    per_dir = 100
    for i in range(files):
        d = root / f"d{i // per_dir // 10}" / f"e{i // per_dir % 10}"
        if i % per_dir == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"{i}\n")
    subprocess.run([ENVGIT, "init"], cwd=root, capture_output=True, check=True)


def find_srt(cache: Path):
    exe = shutil.which("srt")
    if exe:
        return exe
    local = cache / "node_modules" / ".bin" / "srt"
    if not local.exists() and shutil.which("npm"):
        subprocess.run(["npm", "install", "--silent", "--prefix", str(cache),
                        "@anthropic-ai/sandbox-runtime"], capture_output=True, timeout=300)
    return str(local) if local.exists() else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--files", type=int, default=10_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-bench-") as tmp:
        root = Path(tmp) / "proj"
        root.mkdir()
        make_project(root, args.files)
        rows = [("bare bwrap --unshare-all true", median_ms(BARE, root, args.runs))]
        rows.append((f"envgit run true ({args.files} files)", median_ms([ENVGIT, "run", "true"], root, args.runs)))
        # the same with the network gate on: a bridge and proxy credentials in every step
        (root / "envgit.yaml").write_text('version: 1\nnetwork:\n  allow: ["example.com"]\n')
        rows.append(("envgit run true, gate on", median_ms([ENVGIT, "run", "true"], root, args.runs)))
        srt = find_srt(Path(tempfile.gettempdir()) / "envgit-bench-srt")
        if srt:
            try:
                rows.append(("srt -c true", median_ms([srt, "-c", "true"], root, max(5, args.runs // 4))))
            except SystemExit as e:         # e.g. srt needs ripgrep: say so, keep the rest
                print(f"srt: not measured: {e}")
                srt = None
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, capture_output=True)
    anchor = rows[0][1][0]
    print(f"{'what':<40} {'median ms':>10} {'min':>7} {'max':>7} {'x bare bwrap':>13}")
    for name, (med, lo, hi) in rows:
        print(f"{name:<40} {med:>10.1f} {lo:>7.1f} {hi:>7.1f} {med / anchor:>13.1f}")
    if not srt:
        print("srt: not measured (not installable here, or it failed to start: see above)")
    print("goal: envgit run true < 25 ms per step on a 10k-file project")


if __name__ == "__main__":
    main()
