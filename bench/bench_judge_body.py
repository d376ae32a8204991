"""What the gate spends on a 1 MiB request body: judging it and recording its facts (what
`envgit policy replay` judges a candidate on). Since the record reads the Request the judge
read, the body is decoded once, and each body predicate and the search for `_method` fields
run once (netrequest.Request.memo); the anchor, measured in the same run, is the way it was:
the record decoding the body again and running all of it again.

    .venv/bin/python bench/bench_judge_body.py [--runs N]

Pure CPU in this process (no sockets): a gzip'd 1 MiB JSON body POSTed to a GitHub GraphQL
path, judged under the default irreversible preset with api.github.com allowed."""

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from envgit.policy import load_policy, network  # noqa: E402
from envgit.policy.netrequest import Request  # noqa: E402
from envgit.policy.replay import request_facts  # noqa: E402
from envgit.proxy import bodies  # noqa: E402

POLICY = ('version: 1\nnetwork:\n  allow: ["api.github.com"]\n  l7:\n    api.github.com: {}\n'
          'irreversible:\n  - preset: default\n')


def body() -> bytes:
    doc = {"query": "query Q($n: Int) { viewer { login repositories(first: $n) { nodes { name } } } }",
           "variables": {"n": 5, "pad": "x" * ((1 << 20) - 200)}}
    return gzip.compress(json.dumps(doc).encode())


def request(raw: bytes) -> Request:
    decoded, complete, err = bodies.decode(raw, "gzip", True)
    return Request(scheme="https", host="api.github.com", port=443, method="POST", path="/graphql",
                   headers={"content-type": "application/json", "content-encoding": "gzip"},
                   body=decoded, body_error=err, body_complete=complete)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "envgit.yaml").write_text(POLICY)
        policy = load_policy(Path(d) / "envgit.yaml")
    raw = body()

    def now():              # judged, then its facts from the same Request
        req = request(raw)
        network.decide_request(policy, req)
        request_facts(req)

    def before():           # judged, then its facts from a Request decoded again, no memo
        network.decide_request(policy, request(raw))
        request_facts(request(raw))
    now(), before()
    a, b = [], []
    for _ in range(args.runs):
        for fn, out in ((before, a), (now, b)):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1000)
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"1 MiB gzip'd GraphQL POST, judged and recorded ({args.runs} runs, medians)")
    print(f"  anchor: record decodes and runs the predicates again  {ma:7.1f} ms")
    print(f"  now: one decode, predicates and _method fields once  {mb:7.1f} ms   x{mb / ma:.2f}")


if __name__ == "__main__":
    main()
