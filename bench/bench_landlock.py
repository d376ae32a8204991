"""What a step costs on a host without user namespaces (Landlock + seccomp, sandbox/landlock_run.py)
beside the same step under bubblewrap, in the same run.

    sudo .venv/bin/python bench/bench_landlock.py [--runs N]

Two projects with the same policy: one whose daemon runs on this host (bubblewrap), one whose
daemon runs on a host that refuses user namespaces (tests/kit/nouserns.py; needs root). Each
step is `envgit run true` (the whole step: the client, the daemon's spec and snapshot, the
sandbox's start and end) and `envgit run -- sh -c 'chmod 644 f; touch f'` (a step whose
metadata calls go through the Landlock launcher's judge, landlock_meta.py), alternating, N of
each; medians of the wall time, and the Landlock one as a ratio of bubblewrap's. The anchor is
the bubblewrap step measured beside it.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from kit import nouserns  # noqa: E402

ENVGIT = str(Path(sys.executable).parent / "envgit")


def project(base: Path, name: str, landlock: bool):
    home = base / name
    root = home / "proj"
    root.mkdir(parents=True)
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "f").write_text("f\n")
    wrap = nouserns.wrap if landlock else (lambda argv: argv)
    subprocess.run(wrap([ENVGIT, "init"]), cwd=root, env=env, capture_output=True, check=True)
    subprocess.run(wrap([ENVGIT, "daemon", "status"]), cwd=root, env=env, capture_output=True, check=True)
    return root, env


def step_ms(root, env, argv) -> float:
    t0 = time.perf_counter()
    subprocess.run([ENVGIT, "run", "--", *argv], cwd=root, env=env, capture_output=True, check=True)
    return (time.perf_counter() - t0) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    if not nouserns.available():
        sys.exit("needs root and user namespaces (tests/kit/nouserns.py)")
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        bw, ll = project(base, "bwrap", False), project(base, "landlock", True)
        steps = {"true": ["true"], "chmod + touch": ["sh", "-c", "chmod 644 f; touch f"]}
        got = {(k, which): [] for k in steps for which in ("bwrap", "landlock")}
        for root, env in (bw, ll):
            step_ms(root, env, ["true"])                       # warm: the daemon's first step
        for _ in range(args.runs):
            for k, argv in steps.items():
                for (root, env), which in ((bw, "bwrap"), (ll, "landlock")):
                    got[(k, which)].append(step_ms(root, env, argv))
        for (root, env) in (bw, ll):
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
    print(f"{args.runs} runs each, medians of the wall time of one step (`envgit run`):")
    for k in steps:
        b, lnd = statistics.median(got[(k, "bwrap")]), statistics.median(got[(k, "landlock")])
        print(f"  {k:14} bubblewrap {b:6.1f} ms   landlock {lnd:6.1f} ms   (x{lnd / b:.2f})")


if __name__ == "__main__":
    main()
