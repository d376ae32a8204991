"""Remote benchmark (issue 16): envgit push beside restic and rclone, to one S3 server, one run.

    .venv/bin/python bench/bench_remote.py [--files N] [--runs R] [--steps S]

One `rclone serve s3` on 127.0.0.1 (local directory backend, tests/s3server.py) serves all
three. A tree of N small files (default 100,000: 20 per folder, ~100 bytes each, plus a
.env), made an envgit project and snapshotted by one real `envgit run -- true`. Then, R times
each (medians):
  first push      `envgit push` of the project into a fresh prefix (new remote, new key)
                  `restic backup` of the same tree into a fresh repository
                  `rclone sync` of the raw tree into a fresh prefix
  incremental     a one-file change: for envgit a real step (`envgit run -- sh -c 'echo >> f'`)
                  then `envgit push` (only the push timed); for restic/rclone the same change
                  then `restic backup` / `rclone sync` again
  audit           `envgit audit --remote` over S journal steps (default 100,000) of three
                  projects on the bucket (journals written directly, then pushed)
Wall-clock times of whole commands (Python start-up and boto3's import included).
Goals (issue 16): incremental push <= 0.1x restic's incremental backup; first push <= restic's
first backup; audit over 100,000 steps in a few seconds.
"""

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tests"))
from s3server import S3Server  # noqa: E402

ENVGIT = str(Path(sys.executable).parent / "envgit")
RCLONE = str(Path(sys.executable).parent / "rclone")


def small_files(root: Path, n: int) -> None:
    for i in range(n):
        d = root / f"d{i // 2000}" / f"s{(i // 20) % 100}"
        if i % 20 == 0:
            d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.txt").write_text(f"file {i} " + "x" * 90)
    (root / ".env").write_text("API_TOKEN=bench-canary\n")


def timed(argv, env, cwd=None) -> float:
    t = time.perf_counter()
    r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])}… failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return took


def synthetic_journal(root: Path, steps: int, seed: int) -> None:
    """A journal of `steps` finished steps (a begin and an end each), hash-chained as envgit
    writes it, inserted in one transaction (envgit's own writer commits per entry)."""
    from envgit.journal import GENESIS, HeadRecord, Journal, entry_hash
    from envgit.journal.rows import canonical
    path = str(root / ".envgit" / "journal.sqlite")
    Journal(path).close()                   # the schema and version
    rows, prev, seq = [], GENESIS, 0
    t0 = time.time_ns() - steps * 1_000_000_000
    for n in range(1, steps + 1):
        marks = ["denied-net"] if n % 97 == seed else []
        for kind, body in (("begin", {"argv": ["npm", "test", str(n)], "cwd": str(root), "session": f"s{seed}",
                                      "user": "bench", "pid": n, "policy_sha256": "0" * 64, "marks": []}),
                           ("end", {"exit_code": n % 3 == 0 and 1 or 0, "signal": None, "duration_ms": 12.5,
                                    "marks": marks, "denied_paths": []})):
            seq += 1
            at = t0 + n * 1_000_000_000 + (kind == "end") * 500_000_000
            text = canonical(body)
            h = entry_hash(seq, n, kind, at, text, prev)
            rows.append((seq, n, kind, at, text, prev, h))
            prev = h
    db = sqlite3.connect(path)
    with db:
        db.executemany("INSERT INTO entries VALUES (?,?,?,?,?,?,?)", rows)
    db.close()
    HeadRecord(str(root / ".envgit" / "journal.head")).write(seq, prev, steps)


def bench_auto(proj, env, k):
    """A step's wall time (`envgit run -- sh -c 'echo >> f'`) with remote b0 set --auto and
    without: the auto-push must not slow a step. Steps alternate off/on so load drifts hit both."""
    def step(i):
        return timed([ENVGIT, "run", "--", "sh", "-c", f"echo {i} >> auto.txt"], env, proj)
    off, on = [], []
    for i in range(k):
        subprocess.run([ENVGIT, "remote", "set", "b0", "--no-auto"], cwd=proj, env=env, check=True, capture_output=True)
        off.append(step(2 * i))
        subprocess.run([ENVGIT, "remote", "set", "b0", "--auto"], cwd=proj, env=env, check=True, capture_output=True)
        on.append(step(2 * i + 1))
        time.sleep(0.5)
    subprocess.run([ENVGIT, "remote", "set", "b0", "--no-auto"], cwd=proj, env=env, check=True, capture_output=True)
    deadline = time.monotonic() + 120
    last = json.loads(subprocess.run([ENVGIT, "log", "-n", "1", "--json"], cwd=proj, env=env,
                                     capture_output=True, text=True).stdout)[-1]["id"]
    pushed = False
    while time.monotonic() < deadline and not pushed:
        r = subprocess.run([ENVGIT, "log", "--remote", "b0", "-n", "1", "--json"], cwd=proj, env=env,
                           capture_output=True, text=True)
        pushed = r.returncode == 0 and json.loads(r.stdout)["steps"][-1]["id"] >= last - 1
        time.sleep(1)
    print(f"\na one-file step, {k} each (medians): without --auto {med(off):.2f} s, with --auto "
          f"{med(on):.2f} s ({med(on) / med(off):.2f}x); the auto-pushes "
          + ("caught up" if pushed else "had NOT caught up within 120 s"))


def bench_push_worker(proj, env, k, restic_inc):
    """The daemon's auto-push after a one-file step: a process started for the push (its
    interpreter and boto3 each time, as before) beside the resident worker (remote/auto.py:
    started once, a line "push" in, "done N" out). Alternated, k each; restic's incremental
    backup of the same change, timed above in the same run, is the anchor."""
    py = [sys.executable, "-P", "-m", "envgit.commands.remote"]
    worker = subprocess.Popen([*py, "--serve", str(proj)], cwd="/", env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    cold, warm = [], []
    try:
        def envgit(*args):
            subprocess.run([ENVGIT, *args], cwd=proj, env=env, check=True, capture_output=True)
        for i in range(2 * k):
            envgit("remote", "set", "b0", "--no-auto")      # the daemon's own auto-push stays out
            envgit("run", "--", "sh", "-c", f"echo worker {i} >> d0/s0/f1.txt")
            envgit("remote", "set", "b0", "--auto")
            t = time.perf_counter()
            if i % 2 == 0:
                subprocess.run([*py, str(proj)], cwd="/", env=env, check=True, capture_output=True)
                cold.append(time.perf_counter() - t)
            else:
                worker.stdin.write(b"push\n")
                worker.stdin.flush()
                if not worker.stdout.readline().startswith(b"done 0"):
                    raise SystemExit("the push worker failed")
                warm.append(time.perf_counter() - t)
    finally:
        subprocess.run([ENVGIT, "remote", "set", "b0", "--no-auto"], cwd=proj, env=env, capture_output=True)
        worker.stdin.close()
        worker.wait()
    r = med(restic_inc)
    print(f"\nauto-push after a one-file step, {k} each (medians): a process a push {med(cold):.2f} s "
          f"({med(cold) / r:.2f}x restic's {r:.2f} s), the resident worker {med(warm):.2f} s "
          f"({med(warm) / r:.2f}x)")


def cpu_timed(argv, env, cwd) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+system of the command and its children): on a loaded
    machine the wall time says more about the neighbours than about the command."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(argv, env, cwd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def push_timed(name, env, cwd) -> tuple[float, float]:
    """(wall seconds of `envgit push`, the push's own seconds as it reports them: the rest is
    the interpreter's start and the imports, boto3's above all)."""
    t = time.perf_counter()
    r = subprocess.run([ENVGIT, "push", name, "--json"], env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"envgit push failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return took, json.loads(r.stdout)["ms"] / 1000


def med(xs):
    return statistics.median(xs) if xs else float("nan")      # nan: a row skipped


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--skip-audit", action="store_true")
    ap.add_argument("--skip-rclone", action="store_true", help="no rclone rows (a 100k-file sync takes minutes)")
    ap.add_argument("--auto-steps", type=int, default=10, help="steps timed with and without --auto")
    ap.add_argument("--worker-pushes", type=int, default=5,
                    help="auto-pushes timed by a process each and by the resident worker")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="envgit-bench-remote-"))
    s3 = S3Server(base / "s3")
    try:
        home = base / "home"
        home.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **s3.env,
               "ENVGIT_MACHINE": "bench", "ENVGIT_DAEMON_IDLE": "600",
               "RESTIC_PASSWORD": "bench", "RCLONE_CONFIG": os.devnull,
               "RCLONE_S3_PROVIDER": "Other", "RCLONE_S3_ENDPOINT": s3.endpoint,
               "RCLONE_S3_ACCESS_KEY_ID": s3.env["AWS_ACCESS_KEY_ID"],
               "RCLONE_S3_SECRET_ACCESS_KEY": s3.env["AWS_SECRET_ACCESS_KEY"]}
        proj = home / "proj"
        proj.mkdir()
        t = time.perf_counter()
        small_files(proj, args.files)
        print(f"tree: {args.files} files ({time.perf_counter() - t:.1f} s to write)", flush=True)
        subprocess.run([ENVGIT, "init"], cwd=proj, env=env, check=True, capture_output=True)
        first = timed([ENVGIT, "run", "--", "true"], env, proj)
        print(f"first envgit step (snapshot of the tree): {first:.1f} s", flush=True)
        res = {k: [] for k in ("envgit_first", "envgit_inc", "restic_first", "restic_inc", "rclone_first",
                               "rclone_inc", "envgit_first_own", "envgit_inc_own")}
        for r in range(args.runs):
            name = f"b{r}"
            subprocess.run([ENVGIT, "remote", "add", name, s3.url(f"envgit-{r}"), "--endpoint", s3.endpoint],
                           cwd=proj, env=env, check=True, capture_output=True)
            wall, own = push_timed(name, env, proj)
            res["envgit_first"].append(wall)
            res["envgit_first_own"].append(own)
            repo = f"s3:{s3.endpoint}/{s3.bucket}/restic-{r}"
            subprocess.run(["restic", "-r", repo, "init"], env=env, check=True, capture_output=True)
            res["restic_first"].append(timed(["restic", "-r", repo, "backup", "-q", str(proj)], env))
            if not args.skip_rclone:
                res["rclone_first"].append(timed([RCLONE, "sync", str(proj), f":s3:{s3.bucket}/raw-{r}"], env))
            print(f"run {r}: first push envgit {res['envgit_first'][-1]:.2f} s ({own:.2f} s its own), "
                  f"restic {res['restic_first'][-1]:.2f} s, rclone {med(res['rclone_first'][-1:]):.2f} s", flush=True)
        for r in range(args.runs):
            name = "b0"
            subprocess.run([ENVGIT, "run", "--", "sh", "-c", f"echo change {r} >> d0/s0/f0.txt"], cwd=proj, env=env,
                           check=True, capture_output=True)
            wall, own = push_timed(name, env, proj)
            res["envgit_inc"].append(wall)
            res["envgit_inc_own"].append(own)
            repo = f"s3:{s3.endpoint}/{s3.bucket}/restic-0"
            res["restic_inc"].append(timed(["restic", "-r", repo, "backup", "-q", str(proj)], env))
            if not args.skip_rclone:
                res["rclone_inc"].append(timed([RCLONE, "sync", str(proj), f":s3:{s3.bucket}/raw-0"], env))
            print(f"run {r}: incremental envgit {res['envgit_inc'][-1]:.2f} s ({own:.2f} s its own), "
                  f"restic {res['restic_inc'][-1]:.2f} s, rclone {med(res['rclone_inc'][-1:]):.2f} s", flush=True)
        print(f"\n{args.files} files, medians of {args.runs} (seconds):")
        print(f"  first push        envgit {med(res['envgit_first']):7.2f}   restic {med(res['restic_first']):7.2f}   "
              f"rclone sync {med(res['rclone_first']):7.2f}   "
              f"envgit/restic {med(res['envgit_first']) / med(res['restic_first']):.2f}x")
        print(f"  incremental push  envgit {med(res['envgit_inc']):7.2f}   restic {med(res['restic_inc']):7.2f}   "
              f"rclone sync {med(res['rclone_inc']):7.2f}   "
              f"envgit/restic {med(res['envgit_inc']) / med(res['restic_inc']):.2f}x")
        print(f"  envgit's push itself (its `ms`, without the interpreter and imports): first "
              f"{med(res['envgit_first_own']):.2f}, incremental {med(res['envgit_inc_own']):.2f}")
        if args.auto_steps:
            bench_auto(proj, env, args.auto_steps)
        if args.worker_pushes:
            bench_push_worker(proj, env, args.worker_pushes, res["restic_inc"])
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=proj, env=env, capture_output=True)

        if not args.skip_audit:
            per = args.steps // 3
            for i, pname in enumerate(("alpha", "beta", "gamma")):
                root = home / pname
                root.mkdir()
                subprocess.run([ENVGIT, "init"], cwd=root, env=env, check=True, capture_output=True)
                synthetic_journal(root, per + (args.steps - 3 * per if i == 0 else 0), i)
                took = timed([ENVGIT, "push", "b0"], env, root)
                print(f"pushed {pname}'s journal in {took:.1f} s", flush=True)
            total = args.steps
            a_json = [cpu_timed([ENVGIT, "audit", "--remote", "b0", "--json"], env, home) for _ in range(args.runs)]
            a_tab = [cpu_timed([ENVGIT, "audit", "--remote", "b0", "--mark", "denied"], env, home)
                     for _ in range(args.runs)]
            out = subprocess.run([ENVGIT, "audit", "--remote", "b0", "--json"], cwd=home, env=env,
                                 capture_output=True, text=True)
            listed = json.loads(out.stdout)["steps"]
            print(f"\naudit over {total} steps of 3 projects (+ the bench project's), medians of {args.runs}:")
            print(f"  audit --json (every step)        {med([a for a, _ in a_json]):.2f} s wall, "
                  f"{med([c for _, c in a_json]):.2f} s CPU   ({len(listed)} steps listed)")
            print(f"  audit --mark denied (the table)  {med([a for a, _ in a_tab]):.2f} s wall, "
                  f"{med([c for _, c in a_tab]):.2f} s CPU")
            print(f"  (load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    finally:
        s3.stop()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
