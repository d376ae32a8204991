"""Reading the journal: log (the timeline) and show (one step whole)."""

import sys

from ..inert import inert
from ..paths import find_project
from . import open_journal, out


def add_parsers(sub, argparse):
    s = sub.add_parser("log", help="the step timeline")
    s.add_argument("--json", action="store_true")
    s.add_argument("--session")
    s.add_argument("-n", type=int, help="only the last N steps")
    s.set_defaults(fn=cmd_log)

    s = sub.add_parser("show", help="one step whole")
    s.add_argument("step", type=int)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_show)


# --- log / show --------------------------------------------------------------------------

def _short(argv, width=60):
    import shlex
    text = " ".join(shlex.join(argv).split())      # one line, whatever the script held
    return text if len(text) <= width else text[:width - 1] + "…"


def cmd_log(args):
    project = find_project()
    j = open_journal(project)
    steps = j.steps(session=args.session, last=args.n or None) if j else []
    if args.json:
        out([s.to_json() for s in steps])
        return 0
    if not steps:
        print("no steps yet: envgit run -- CMD")
        return 0
    for s in steps:
        exit_ = {"running": "run", "interrupted": "int"}.get(s.status, str(s.exit_code))
        dur = f"{s.duration_ms:.0f}ms" if s.duration_ms is not None else "-"
        marks = " [" + inert(",".join(s.marks)) + "]" if s.marks else ""
        print(f"{s.id:>4}  {s.started_at[:19].replace('T', ' ')}  exit {exit_:>3}  {dur:>8}  "
              f"{inert(_short(s.argv))}{marks}")
    return 0


def cmd_show(args):
    project = find_project()
    j = open_journal(project)
    s = j.step(args.step) if j else None
    if s is None:
        print(f"envgit: no step {args.step}; `envgit log` lists them", file=sys.stderr)
        return 2
    if args.json:
        out(s.to_json())
        return 0
    import shlex
    print(f"step {s.id}  ({s.status})")
    print(f"  command   {inert(shlex.join(s.argv))}")
    print(f"  cwd       {inert(s.cwd)}")
    print(f"  started   {s.started_at}")
    print(f"  ended     {s.ended_at or '-'}")
    print(f"  exit      {s.exit_code if s.exit_code is not None else '-'}"
          + (f" ({inert(s.signal)})" if s.signal else ""))
    print(f"  duration  {s.duration_ms if s.duration_ms is not None else '-'} ms")
    print(f"  policy    sha256 {s.policy_sha256}")
    print(f"  user      {inert(s.user)}   session {inert(s.session)}")
    if s.tool_call_id:
        print(f"  tool call {inert(s.tool_call_id)}")
    if s.marks:
        print(f"  marks     {inert(', '.join(s.marks))}")
    for p in s.denied_paths:
        print(f"  denied    {inert(p)}")
    for p in s.escape_routes:       # a file a program outside the sandbox obeys (escape-route-written)
        print(f"  escape    {inert(p)}")
    for r in s.requests:
        answer = f", {r['answer']} by {r.get('answered_by')} ({r.get('answered_how')})" if r.get("answer") else ""
        print(inert(f"  request   {r.get('decision', '?'):5} {r.get('method', '')} {r.get('scheme', '')}://"
                    f"{r.get('host', '')}{r.get('path', '')} -> {r.get('status', '-')}  ({r.get('rule', '')}{answer})"))
    for a in s.approvals:
        q = a.get("question", {})
        print(inert(f"  approval  {a.get('answer')} {q.get('method')} {q.get('host')}{q.get('path')} "
                    f"by {a.get('who')} ({a.get('how')})"))
    for e in s.events:
        detail = " ".join(f"{k}={v}" for k, v in e.items() if k != "kind" and not isinstance(v, (dict, list)))
        print(inert(f"  event     {e['kind']} {detail}"))
    snap = s.snapshot or {}
    if snap.get("tree"):
        left = snap.get("left_out", {})
        print(f"  snapshot  {snap['tree'][:12]}  +{snap['added']} ~{snap['modified']} -{snap['deleted']} "
              f"files, {snap['ms']:.1f} ms" + (f"; left out {left['count']} ({left['bytes']} bytes)"
                                               if left.get("count") else ""))
        for p in snap.get("paths", [])[:20]:
            print(f"            {p['status'][0].upper()} {inert(p['path'])}")
        if snap.get("diff_error"):
            print(f"            {inert(snap['diff_error'])}")
    elif snap.get("error"):
        print(f"  snapshot  {inert(snap['error'])}")
    return 0
