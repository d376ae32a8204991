"""The first step of a session: `envgit run true` with no daemon running, on a small project,
with the network gate (the policy allows a host) beside the same without it (no host
allowed: no gate), both measured in this run, alternating, the daemon stopped before each.

    .venv/bin/python bench/bench_first_step.py [--runs N]

Anchor: the first step without the gate. Goal (issue 31): the gated first step at most 300 ms.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVGIT = str(Path(sys.executable).parent / "envgit")


def first_step_ms(root: Path, env) -> float:
    subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
    t = time.perf_counter()
    r = subprocess.run([ENVGIT, "run", "--", "true"], cwd=root, env=env, capture_output=True)
    ms = (time.perf_counter() - t) * 1000
    if r.returncode != 0:
        raise SystemExit(f"envgit run failed: {r.stderr.decode()[-500:]}")
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "HOME": d}
        projects = {}
        for name, allow in (("no gate", "[]"), ("gate", '["example.com"]')):
            root = Path(d) / name.replace(" ", "-")
            root.mkdir()
            for i in range(100):
                (root / f"f{i}.txt").write_text(f"{i}\n")
            subprocess.run([ENVGIT, "init"], cwd=root, env=env, capture_output=True, check=True)
            (root / "envgit.yaml").write_text(f"version: 1\nnetwork:\n  allow: {allow}\n")
            subprocess.run([ENVGIT, "run", "--", "true"], cwd=root, env=env, capture_output=True)
            projects[name] = root
        times: dict[str, list[float]] = {k: [] for k in projects}
        for _ in range(args.runs):
            for name, root in projects.items():
                times[name].append(first_step_ms(root, env))
        for root in projects.values():
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
    anchor = statistics.median(times["no gate"])
    gated = statistics.median(times["gate"])
    print(f"first step of a session, 100-file project ({args.runs} runs each, medians)")
    print(f"  anchor: without the gate   {anchor:7.0f} ms")
    print(f"  with the gate              {gated:7.0f} ms   x{gated / anchor:.2f}   goal <= 300 ms "
          + ("ok" if gated <= 300 else "MISSED"))


if __name__ == "__main__":
    main()
