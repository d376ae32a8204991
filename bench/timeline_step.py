"""The client's side of one step as a timeline: when each part of `envgit run true` ends,
measured from the moment the parent starts the client (CLOCK_MONOTONIC is one clock for every
process on the machine). docs/PERFORMANCE.md has the table this prints and how to read it.

    .venv/bin/python bench/timeline_step.py [--runs N] [--files N] [--gate]

The client here is envgit's own `run`, with its functions wrapped to note the time (a
microsecond each); the marks are the medians over N steps (default 40), each beside the bare
`bwrap --unshare-all true` of the same run.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import BARE, ENVGIT, make_project  # noqa: E402

PY = sys.executable

# Runs as the client: marks the interpreter's readiness, wraps the step's parts, then runs it.
PROBE = r"""
import os, sys, time
T0 = int(os.environ.pop("TIMELINE_T0"))
OUT = os.environ.pop("TIMELINE_OUT")
marks = [("interpreter ready", time.monotonic_ns())]
def mark(name):
    marks.append((name, time.monotonic_ns()))
from envgit.cli import _exit_now      # the client's entry, as `envgit run` starts
import envgit.run as r
from envgit.sandbox import launch as L
mark("imports (envgit.run)")
_connect = r.connect
def connect(project):
    mark("project found, bwrap and perl checked")
    c = _connect(project)
    mark("connected to the daemon")
    _req = c.request
    def request(msg, *a, **k):
        rep = _req(msg, *a, **k)
        mark(f"reply to {msg.get('op')}")
        return rep
    c.request = request
    return c
r.connect = connect
for name, label in (("spawn", "bwrap spawned"), ("ready", "bwrap's info (namespaces made)"),
                    ("release", "command released")):
    def wrap(f, label=label):
        def w(*a, **k):
            out = f(*a, **k)
            mark(label)
            return out
        return w
    setattr(L.Launch, name, wrap(getattr(L.Launch, name)))
_wait = r._wait
def wait(*a, **k):
    st = _wait(*a, **k)
    mark("the sandbox exited")
    return st
r._wait = wait
code = r.run(sys.argv[1:])
mark("client done")
with open(OUT, "w") as f:            # plain lines: json would import re (~5 ms)
    f.write("".join(f"{(t - T0) / 1e6}\t{n}\n" for n, t in marks))
_exit_now(code)
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--gate", action="store_true", help="with the network gate on (a policy allowing a host)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-timeline-") as tmp:
        root = Path(tmp) / "proj"
        root.mkdir()
        make_project(root, args.files)
        out = Path(tmp) / "marks.txt"
        if args.gate:
            (root / "envgit.yaml").write_text('version: 1\nnetwork:\n  allow: ["example.com"]\n')
        subprocess.run([ENVGIT, "run", "true"], cwd=root, capture_output=True, check=True)   # daemon up
        runs: list[dict] = []
        walls, bares = [], []
        for _ in range(args.runs):
            t = time.perf_counter()
            subprocess.run(BARE, capture_output=True, check=True)
            bares.append((time.perf_counter() - t) * 1000)
            env = dict(os.environ, TIMELINE_OUT=str(out))
            env["TIMELINE_T0"] = str(time.monotonic_ns())
            t = time.perf_counter()
            subprocess.run([PY, "-P", "-c", PROBE, "true"], cwd=root, env=env, capture_output=True, check=True)
            walls.append((time.perf_counter() - t) * 1000)
            runs.append({n: float(ms) for ms, n in (ln.split("\t", 1) for ln in out.read_text().splitlines())})
        subprocess.run([ENVGIT, "daemon", "stop"], cwd=root, capture_output=True)
    bare = statistics.median(bares)
    wall = statistics.median(walls)
    print(f"one step, `envgit run true`{', gate on' if args.gate else ''}, {args.files} files, medians of {args.runs}: "
          f"{wall:.1f} ms wall; bare bwrap {bare:.1f} ms (x{wall / bare:.1f})")
    prev = 0.0
    for name in runs[0]:
        at = statistics.median(r[name] for r in runs if name in r)
        print(f"  {at:7.1f} ms  (+{at - prev:5.1f})  {name}")
        prev = at
    print(f"  {wall:7.1f} ms  (+{wall - prev:5.1f})  the parent saw the client exit")


if __name__ == "__main__":
    main()
