"""Fork benchmark (issue 27): `envgit fork 4` of a project beside `git worktree add` x4 and
`cp -a` x4 of the same tree, in the same run; then a step in a branch beside a step in the
main tree.

    .venv/bin/python bench/bench_fork.py [--files N] [--runs N] [--steps N]

The project: N small files (~100 bytes, 20 per folder, two levels deep, as bench_snapshot.py),
committed to git, `envgit init`, one step (`envgit run true`) so there is a snapshot to fork.
Time: wall clock of the whole command (all four made). Extra disk: `du` of the main tree and
the four new directories together minus `du` of the main tree alone (du counts a hard-linked
file once per invocation, so the shared packs count as what they are: no new blocks).
Medians of --runs runs; each run's copies are removed before the next.
Goal (issue 27): fork <= 1 s, <= 0.05x `git worktree add` x4, extra disk < 10 MB.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ENVGIT = str(BIN / "envgit")
GIT_ENV = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com", "GIT_CONFIG_NOSYSTEM": "1"}


def small_files(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"d{i // 2000}" / f"s{(i // 20) % 100}"
        if i % 20 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"file {i} " + "x" * 90)


def sh(argv, cwd, env=None):
    r = subprocess.run(argv, cwd=cwd, env={**os.environ, **GIT_ENV, **(env or {})}, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def timed(argv, cwd, env=None) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    r = sh(argv, cwd, env)
    return (time.perf_counter() - t) * 1000, r


def du_kb(*paths) -> int:
    r = subprocess.run(["du", "-skc", *map(str, paths)], capture_output=True, text=True, check=True)
    return int(r.stdout.strip().splitlines()[-1].split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="envgit-bench-fork-", dir=os.environ.get("BENCH_DIR")))
    env = {"HOME": str(base), "ENVGIT_DAEMON_IDLE": "600"}
    root = base / "app"
    root.mkdir()
    try:
        t = time.perf_counter()
        small_files(root, args.files)
        sh(["git", "init", "-q", "-b", "main"], root)
        sh(["git", "add", "-A"], root)
        sh(["git", "commit", "-qm", "tree"], root)
        sh([ENVGIT, "init"], root, env)
        first_ms, _ = timed([ENVGIT, "run", "true"], root, env)
        print(f"project: {args.files} files, {du_kb(root) // 1024} MB with .git and the store; "
              f"built in {time.perf_counter() - t:.0f} s; first step (snapshot of it all) {first_ms:.0f} ms",
              flush=True)
        main_kb = du_kb(root)
        rows: dict[str, list[tuple[float, int]]] = {"envgit fork 4": [], "git worktree add x4": [], "cp -a x4": []}
        for run in range(args.runs):
            into = base / f"forks{run}"
            ms, r = timed([ENVGIT, "fork", "4", "--into", str(into), "--json"], root, env)
            dirs = [b["dir"] for b in json.loads(r.stdout)["branches"]]
            rows["envgit fork 4"].append((ms, du_kb(root, *dirs) - main_kb))
            for b in json.loads(r.stdout)["branches"]:
                sh([ENVGIT, "branch", "rm", str(b["id"]), "--force"], root, env)

            wts = [base / f"wt{run}-{i}" for i in range(4)]
            t = time.perf_counter()
            for i, w in enumerate(wts):
                sh(["git", "worktree", "add", "-q", "-b", f"b{run}-{i}", str(w)], root)
            ms = (time.perf_counter() - t) * 1000
            rows["git worktree add x4"].append((ms, du_kb(root, *wts) - main_kb))
            for w in wts:
                sh(["git", "worktree", "remove", "--force", str(w)], root)

            cps = [base / f"cp{run}-{i}" for i in range(4)]
            t = time.perf_counter()
            for c in cps:
                sh(["cp", "-a", str(root), str(c)], base)
            ms = (time.perf_counter() - t) * 1000
            rows["cp -a x4"].append((ms, du_kb(root, *cps) - main_kb))
            for c in cps:
                shutil.rmtree(c)
            print(f"run {run + 1}: " + ", ".join(f"{k} {v[-1][0]:.0f} ms" for k, v in rows.items()), flush=True)

        # a step in a branch beside a step in the main tree (alternating; the first of each is warm-up)
        branch = Path(json.loads(sh([ENVGIT, "fork", "1", "--into", str(base / "step"), "--json"],
                                    root, env).stdout)["branches"][0]["dir"])
        step = {"main": [], "branch": []}
        for k in range(args.steps + 1):
            for name, where in (("main", root), ("branch", branch)):
                ms, _ = timed([ENVGIT, "run", "--", "sh", "-c", f"echo {k} > d0/s0/f0.txt"], where, env)
                if k:
                    step[name].append(ms)
        sh([ENVGIT, "daemon", "stop"], branch, env)
        sh([ENVGIT, "daemon", "stop"], root, env)

        med = {k: (statistics.median(m for m, _ in v), statistics.median(d for _, d in v)) for k, v in rows.items()}
        wt_ms = med["git worktree add x4"][0]
        print(f"\n{args.files} files; medians of {args.runs} runs; ratio = time / `git worktree add` x4")
        print(f"{'what':<22} {'ms':>9} {'ratio':>7} {'extra disk MB':>14}")
        for k, (ms, kb) in med.items():
            print(f"{k:<22} {ms:>9.0f} {ms / wt_ms:>7.2f} {kb / 1024:>14.1f}")
        m, b = statistics.median(step["main"]), statistics.median(step["branch"])
        print(f"\nstep (`envgit run` writing one file), median of {args.steps}: main {m:.0f} ms, "
              f"branch {b:.0f} ms, ratio {b / m:.2f}")
        f_ms, f_kb = med["envgit fork 4"]
        print(f"goal fork <= 1000 ms: {'MET' if f_ms <= 1000 else 'MISSED'} ({f_ms:.0f} ms); "
              f"<= 0.05x worktree: {'MET' if f_ms <= 0.05 * wt_ms else 'MISSED'} ({f_ms / wt_ms:.2f}x); "
              f"extra disk < 10 MB: {'MET' if f_kb < 10 * 1024 else 'MISSED'} ({f_kb / 1024:.1f} MB); "
              f"step in a branch within 10 %: {'MET' if b <= 1.1 * m else 'MISSED'}")
    finally:
        for d in base.iterdir() if base.exists() else ():
            if (d / ".envgit").is_dir():
                subprocess.run([ENVGIT, "daemon", "stop"], cwd=d, env={**os.environ, **env}, capture_output=True)
        subprocess.run(["chmod", "-R", "u+rwX", str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
