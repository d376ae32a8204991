"""`envgit ui` benchmark: the timeline's first page against a 10,000-step journal, beside an
anchor measured in the same run on the same journal.

    .venv/bin/python bench/bench_ui.py [--steps 10000] [--runs 15]

The journal is built by direct appends (bench_journal.make_project: a begin, a request and an
end with a snapshot summary per step). Then the real `envgit ui` is started on it and each
figure is the median of --runs requests, each on a fresh connection, timed from the request
to the last byte of the response (the page rendered by the server, 50 rows):
  first page        GET /
  older page        GET /?before=5000 (a page from the middle)
  filter by mark    GET /?mark=asked (no step has it: the whole journal's marks looked at)
  filter by text    GET /?q=echo%209999 (the commands searched in SQL)
  step page         GET /steps/5000
  live look         GET /events until its first event (a stream's first look at the journal)
Anchor: `envgit log -n 50` (a process that reads the last 50 steps and prints them), median of
--runs runs. Both are printed in ms, the page figures also as a ratio to the anchor.
"""

import argparse
import http.client
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_journal import ENVGIT, make_project  # noqa: E402


def start_ui(root):
    p = subprocess.Popen(ENVGIT + ["ui", "--no-open", "--json"], cwd=root, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    text, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline:
        if select.select([p.stdout], [], [], 0.5)[0]:
            text += os.read(p.stdout.fileno(), 4096)
            try:
                return p, json.loads(text)
            except ValueError:
                continue
    p.kill()
    raise SystemExit("envgit ui did not start")


def timed_get(port, path, token, first_event=False) -> float:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    sep = "&" if "?" in path else "?"
    t = time.perf_counter()
    c.request("GET", f"{path}{sep}token={token}", headers={"Host": f"127.0.0.1:{port}"})
    r = c.getresponse()
    if first_event:
        while b"event:" not in r.readline():
            pass
    else:
        body = r.read()
        assert r.status == 200 and body, (path, r.status)
    ms = (time.perf_counter() - t) * 1000
    c.close()
    return ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="envgit-bench-ui-") as tmp:
        t = time.perf_counter()
        project = make_project(Path(tmp) / "p", args.steps)
        print(f"journal: {args.steps} steps built in {time.perf_counter() - t:.1f} s")
        proc, info = start_ui(project.root)
        port, token = info["port"], info["url"].split("token=", 1)[1]
        try:
            mid = args.steps // 2
            cases = [("first page", "/", False), ("older page", f"/?before={mid}", False),
                     ("filter by mark", "/?mark=asked", False),
                     ("filter by text", f"/?q=echo%20{args.steps - 1}", False),
                     ("step page", f"/steps/{mid}", False), ("live look", "/events", True)]
            cold = timed_get(port, "/", token)
            results = {name: [] for name, _, _ in cases}
            anchor = []
            for _ in range(args.runs):            # interleaved: load on the machine hits both alike
                for name, path, ev in cases:
                    results[name].append(timed_get(port, path, token, ev))
                t = time.perf_counter()
                subprocess.run(ENVGIT + ["log", "-n", "50"], cwd=project.root, check=True, stdout=subprocess.DEVNULL)
                anchor.append((time.perf_counter() - t) * 1000)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        a = statistics.median(anchor)
        print(f"anchor: envgit log -n 50: {a:.1f} ms (median of {args.runs})")
        print(f"first request after start (cold): {cold:.1f} ms")
        for name, _, _ in cases:
            m = statistics.median(results[name])
            print(f"{name:16} {m:8.1f} ms  ({m / a:.2f} x anchor; min {min(results[name]):.1f}, "
                  f"max {max(results[name]):.1f})")


if __name__ == "__main__":
    main()
