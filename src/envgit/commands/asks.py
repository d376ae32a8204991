"""The questions a step asks a person: pending, approve, deny."""

import os

from ..inert import inert
from ..paths import find_project
from . import Usage, command, iso_utc, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "pending", help="questions waiting for a person (asks of running steps)",
                example=["envgit pending", "envgit pending --json"])
    json_flag(s)
    s.set_defaults(fn=cmd_pending)
    s = command(sub, "approve", help="allow a pending request",
                example=["envgit approve 3", "envgit approve 3 --rule", "envgit approve 3 --remember",
                         "envgit approve 3 --remember --for 2h --path '/repos/me/*/issues'"])
    s.add_argument("id", type=int, help="the question's id (`envgit pending` lists them)")
    s.add_argument("--rule", action="store_true",
                   help="allow what the same rule matches on that host for the rest of the step")
    s.add_argument("--remember", action="store_true",
                   help="also allow later requests with exactly this effect (method, host, port, path "
                        "and query; a push's repository and refs; GraphQL operations) without asking, "
                        "in any step, until the grant expires or is revoked (`envgit grants`)")
    s.add_argument("--for", dest="for_", metavar="DURATION", type=_duration,
                   help="how long a remembered grant lasts (30m, 8h, 2d; default 8h)")
    s.add_argument("--path", metavar="GLOB",
                   help="widen a remembered request's path to this glob (it must include the path "
                        "asked about; `*` is one segment, `**` any); the widening is recorded")
    json_flag(s)
    s.set_defaults(fn=cmd_approve)
    s = command(sub, "deny", help="deny a pending request", example="envgit deny 3")
    s.add_argument("id", type=int, help="the question's id (`envgit pending` lists them)")
    json_flag(s)
    s.set_defaults(fn=cmd_deny)


# What a question holds, whoever asked it (the gate: proxy/addon.py `_question`; an MCP tool
# call: mcp/execution.py): every key present in `pending --json`, None when it has none.
QUESTION_KEYS = ("step", "method", "scheme", "host", "port", "path", "rule", "kind", "reason",
                 "refs", "repository", "operations", "options", "method_override", "query_sha256",
                 "covers")


def pending_json(a) -> dict:
    q = a.get("question") or {}
    return {"id": a.get("id"), "step": a.get("step"), "asked_at": iso_utc(a.get("asked_at")),
            "question": {k: q.get(k) for k in QUESTION_KEYS}}


# --- pending / approve / deny ------------------------------------------------------------

def cmd_pending(args):
    from ..daemon.client import DaemonError, connect
    project = find_project()
    try:
        asks = connect(project, start=False).request({"op": "pending"})["asks"]
    except DaemonError:
        asks = []                       # no daemon: nothing can be waiting
    if args.json:
        out([pending_json(a) for a in asks])
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


def _duration(text) -> int:
    import argparse

    from ..daemon.grants import GrantError, parse_for
    try:
        return parse_for(text)
    except GrantError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _answer(args, answer):
    from ..daemon.client import DaemonError, connect
    project = find_project()
    msg = {"op": "answer", "id": args.id, "answer": answer, "uid": os.getuid(),
           "how": "envgit " + ("approve --rule" if answer == "allow-rule" else
                               "approve" if answer == "allow" else "deny")}
    remember = getattr(args, "remember", False)
    if not remember and (getattr(args, "for_", None) is not None or getattr(args, "path", None)):
        raise Usage("--for and --path shape a remembered grant: add --remember")
    if remember:
        if answer != "allow":
            raise Usage("--remember remembers one effect: it does not go with --rule")
        msg["remember"] = {k: v for k, v in (("for_s", args.for_), ("path", args.path)) if v is not None}
    try:
        r = connect(project, start=False).request(msg)
    except DaemonError:
        raise Usage("no session daemon is running, so nothing is waiting") from None
    if "error" in r:
        raise Usage(r["error"], r.get("exit", 1))
    grant = r.get("grant")
    if args.json:
        out({"id": args.id, "step": r["step"], "answer": answer, "grant": grant})
        return 0
    print(f"question {args.id} of step {r['step']}: {answer}")
    if grant:
        from ..view.names import grant_line
        print(f"remembered as grant {grant['id']}: {grant_line(grant)}")
    return 0


def cmd_approve(args):
    return _answer(args, "allow-rule" if args.rule else "allow")


def cmd_deny(args):
    return _answer(args, "deny")
