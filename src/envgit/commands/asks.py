"""The questions a step asks a person: pending, approve, deny."""

import os
import sys

from ..inert import inert
from ..paths import find_project
from . import out


def add_parsers(sub, argparse):
    s = sub.add_parser("pending", help="questions waiting for a person (asks of running steps)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_pending)
    s = sub.add_parser("approve", help="allow a pending request")
    s.add_argument("id", type=int)
    s.add_argument("--rule", action="store_true",
                   help="allow what the same rule matches on that host for the rest of the step")
    s.set_defaults(fn=cmd_approve)
    s = sub.add_parser("deny", help="deny a pending request")
    s.add_argument("id", type=int)
    s.set_defaults(fn=cmd_deny)


# --- pending / approve / deny ------------------------------------------------------------

def cmd_pending(args):
    from ..daemon.client import DaemonError, connect
    project = find_project()
    try:
        asks = connect(project, start=False).request({"op": "pending"})["asks"]
    except DaemonError:
        asks = []                       # no daemon: nothing can be waiting
    if args.json:
        out(asks)
        return 0
    if not asks:
        print("nothing is waiting for an answer")
    import time
    for a in asks:
        q = a["question"]
        refs = " ".join(r.get("ref", "") for r in q.get("refs") or [])
        print(f"{a['id']:>4}  step {a['step']}  " + inert(f"{q['method']} {q['host']}{q['path']}  "
              f"{q.get('kind') or ''} {refs}  rule {q.get('rule')}") +
              f"  waiting {time.time() - a['asked_at']:.0f}s")
    return 0


def _answer(args, answer):
    from ..daemon.client import DaemonError, connect
    project = find_project()
    try:
        r = connect(project, start=False).request(
            {"op": "answer", "id": args.id, "answer": answer, "uid": os.getuid(),
             "how": "envgit " + ("approve --rule" if answer == "allow-rule" else
                                 "approve" if answer == "allow" else "deny")})
    except DaemonError:
        print("envgit: no session daemon is running, so nothing is waiting", file=sys.stderr)
        return 2
    if "error" in r:
        print(r["error"], file=sys.stderr)
        return r.get("exit", 1)
    print(f"question {args.id} of step {r['step']}: {answer}")
    return 0


def cmd_approve(args):
    return _answer(args, "allow-rule" if args.rule else "allow")


def cmd_deny(args):
    return _answer(args, "deny")
