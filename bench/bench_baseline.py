"""The first step on a large project (its baseline snapshot: every file read and stored) beside
`git add -A && git write-tree` of the same tree into a fresh repository, in the same run.

    .venv/bin/python bench/bench_baseline.py [--files 100000] [--runs 3]

Each run starts from nothing: envgit's state directory is removed and `envgit init` made
again (not timed), then `envgit run -- true` is timed whole (the daemon's start, the baseline
snapshot, the step, its end); git gets a fresh GIT_DIR each run (`git init` not timed). The
two alternate so load drifts hit both; the page cache is warm for both (the tree is read once
before the first run). Files: ~100 bytes each, 20 per folder, as bench_snapshot.py's trees.
Goal (issue 31): the first step no slower than git (ratio <= 1).
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_snapshot import GIT_ENV, small_files  # noqa: E402

ENVGIT = str(Path(sys.executable).parent / "envgit")


def timed(argv, cwd, env) -> float:
    t = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "tree"
        root.mkdir()
        small_files(root, args.files)
        env = {**os.environ, "HOME": d}
        git_dir = Path(d) / "git"
        git_env = {**env, **GIT_ENV, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(root)}
        for p in root.rglob("*"):          # warm the page cache for both
            p.stat()
        first, git = [], []
        for _ in range(args.runs):
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
            shutil.rmtree(root / ".envgit", ignore_errors=True)
            (root / "envgit.yaml").unlink(missing_ok=True)
            subprocess.run([ENVGIT, "init"], cwd=root, env=env, check=True, capture_output=True)
            first.append(timed([ENVGIT, "run", "--", "true"], root, env))
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
            shutil.rmtree(git_dir, ignore_errors=True)
            subprocess.run(["git", "init", "-q", "--bare", str(git_dir)], check=True, env={**env, **GIT_ENV})
            t = time.perf_counter()
            subprocess.run(["git", "add", "-A"], cwd=root, env=git_env, check=True, capture_output=True)
            subprocess.run(["git", "write-tree"], cwd=root, env=git_env, check=True, capture_output=True)
            git.append(time.perf_counter() - t)
    f, g = statistics.median(first), statistics.median(git)
    print(f"first step on a {args.files}-file project, {args.runs} runs each, medians "
          f"(load {os.getloadavg()[0]:.1f})")
    print(f"  anchor: git add -A && git write-tree   {g:7.2f} s   (runs: {', '.join(f'{x:.2f}' for x in git)})")
    print(f"  envgit run -- true, first of a project {f:7.2f} s   (runs: {', '.join(f'{x:.2f}' for x in first)})"
          f"   x{f / g:.2f}   goal <= 1x " + ("ok" if f <= g else "MISSED"))


if __name__ == "__main__":
    main()
