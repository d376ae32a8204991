"""The CPU a porcelain command and a gate's start cost, beside their anchors in the same run.

    .venv/bin/python bench/bench_cli.py [--runs N]

- A command: the CPU (user + system) of `envgit log --json`, `envgit show 1` and `envgit daemon
  status` in a project of a few steps, beside the anchor `python -c pass` (the same venv's
  interpreter starting and doing nothing): the medians of N runs each, alternating.
- A gate's start: the session daemon's own CPU (from /proc/PID/stat) after one step that makes
  a request (curl), in a new project whose policy allows a host (the gate starts, its session CA is made), beside
  the same in a new project without network rules (no gate): the medians of N projects each.

CPU, not wall time: the test suite runs six at once on two cores, where CPU is what is short.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ENVGIT = str(Path(sys.executable).parent / "envgit")
TICK = os.sysconf("SC_CLK_TCK")


def child_cpu_ms(argv, cwd, env) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, env=env, capture_output=True, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)) * 1000


def project(base: Path, name: str, policy: str | None = None) -> tuple[Path, dict]:
    home = base / name
    root = home / "proj"
    root.mkdir(parents=True)
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([ENVGIT, "init"], cwd=root, env=env, capture_output=True, check=True)
    if policy:
        (root / "envgit.yaml").write_text(policy)
    return root, env


def daemon_cpu_ms(root: Path, env: dict) -> float:
    """The daemon's CPU after one step that makes a request (with the gate, the request waits
    for the gate's start, which runs in the background: so it is over when this is read). The
    daemon is not the caller's child: its CPU is read from /proc."""
    subprocess.run([ENVGIT, "run", "--", "sh", "-c", "curl -s -m 30 https://example.test/ >/dev/null; true"],
                   cwd=root, env=env, capture_output=True, check=True)
    status = json.loads(subprocess.run([ENVGIT, "daemon", "status"], cwd=root, env=env,
                                       capture_output=True, check=True).stdout)
    with open(f"/proc/{status['pid']}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ms = (int(fields[11]) + int(fields[12])) * 1000 / TICK
    subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
    return ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-bench-cli-") as tmp:
        base = Path(tmp)
        root, env = project(base, "steps")
        for i in range(5):
            subprocess.run([ENVGIT, "run", "--", "sh", "-c", f"echo {i} > f"], cwd=root, env=env,
                           capture_output=True, check=True)
        commands = {"log --json": ["log", "--json"], "show 1": ["show", "1"],
                    "daemon status": ["daemon", "status"]}
        anchor, got = [], {k: [] for k in commands}
        for _ in range(args.runs):
            anchor.append(child_cpu_ms([sys.executable, "-c", "pass"], root, env))
            for k, argv in commands.items():
                got[k].append(child_cpu_ms([ENVGIT, *argv], root, env))
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, env=env, capture_output=True)
        a = statistics.median(anchor)
        print(f"CPU of a command ({args.runs} runs each, medians)")
        print(f"  anchor: python -c pass      {a:6.1f} ms")
        for k, v in got.items():
            m = statistics.median(v)
            print(f"  envgit {k:<20} {m:6.1f} ms   x{m / a:.2f}")

        plain, gated = [], []
        policy = 'version: 1\nnetwork:\n  allow: ["example.test:443"]\n'
        for i in range(args.runs):
            plain.append(daemon_cpu_ms(*project(base, f"plain{i}")))
            gated.append(daemon_cpu_ms(*project(base, f"gated{i}", policy)))
        p, g = statistics.median(plain), statistics.median(gated)
        print(f"CPU of a new project's daemon after one step ({args.runs} projects each, medians)")
        print(f"  anchor: no network rules     {p:6.0f} ms")
        print(f"  the gate started             {g:6.0f} ms   x{g / p:.2f}")


if __name__ == "__main__":
    main()
