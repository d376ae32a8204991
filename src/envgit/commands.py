"""What each porcelain command does: call the part that owns the work, render its answer."""

import json
import os
import sys

from .paths import NoProject, find_project


def dispatch(args) -> int:
    fn = globals()["cmd_" + args.cmd]
    try:
        return fn(args)
    except NoProject as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2


def _out(obj):
    print(json.dumps(obj, indent=2, ensure_ascii=False))


# --- init --------------------------------------------------------------------------------

def cmd_init(args):
    from .policy import defaults
    root = os.path.realpath(os.getcwd())
    policy = os.path.join(root, "envgit.yaml")
    if os.path.exists(policy) and not args.force:
        print(f"envgit: {policy} exists; keeping it (use --force to overwrite)", file=sys.stderr)
    else:
        tmp = policy + ".tmp"
        with open(tmp, "w") as f:       # whole or absent: write, then rename
            f.write(defaults.TEMPLATE)
        os.replace(tmp, policy)
        print(f"wrote {policy}")
    state = os.path.join(root, ".envgit")
    os.makedirs(state, mode=0o700, exist_ok=True)
    gi = os.path.join(root, ".gitignore")
    lines = open(gi).read().splitlines() if os.path.exists(gi) else []
    if not any(l.strip() in (".envgit", ".envgit/", "/.envgit", "/.envgit/") for l in lines):
        with open(gi, "a") as f:
            if lines and lines[-1] != "":
                f.write("\n")
            f.write(".envgit/\n")
        print(f"added .envgit/ to {gi}")
    print(f"initialised envgit in {root}; next: envgit run -- CMD")
    return 0


# --- log / show --------------------------------------------------------------------------

def _journal(project):
    from .daemon.repair import repair_if_no_daemon
    from .journal import Journal
    repair_if_no_daemon(project)
    try:
        return Journal(project.journal, readonly=True)
    except FileNotFoundError:
        return None


def _short(argv, width=60):
    import shlex
    text = shlex.join(argv)
    return text if len(text) <= width else text[:width - 1] + "…"


def cmd_log(args):
    project = find_project()
    j = _journal(project)
    steps = j.steps(session=args.session) if j else []
    if args.n:
        steps = steps[-args.n:]
    if args.json:
        _out([s.to_json() for s in steps])
        return 0
    if not steps:
        print("no steps yet: envgit run -- CMD")
        return 0
    for s in steps:
        exit_ = {"running": "run", "interrupted": "int"}.get(s.status, str(s.exit_code))
        dur = f"{s.duration_ms:.0f}ms" if s.duration_ms is not None else "-"
        marks = " [" + ",".join(s.marks) + "]" if s.marks else ""
        print(f"{s.id:>4}  {s.started_at[:19].replace('T', ' ')}  exit {exit_:>3}  {dur:>8}  "
              f"{_short(s.argv)}{marks}")
    return 0


def cmd_show(args):
    project = find_project()
    j = _journal(project)
    s = j.step(args.step) if j else None
    if s is None:
        print(f"envgit: no step {args.step}; `envgit log` lists them", file=sys.stderr)
        return 2
    if args.json:
        _out(s.to_json())
        return 0
    import shlex
    print(f"step {s.id}  ({s.status})")
    print(f"  command   {shlex.join(s.argv)}")
    print(f"  cwd       {s.cwd}")
    print(f"  started   {s.started_at}")
    print(f"  ended     {s.ended_at or '-'}")
    print(f"  exit      {s.exit_code if s.exit_code is not None else '-'}"
          + (f" ({s.signal})" if s.signal else ""))
    print(f"  duration  {s.duration_ms if s.duration_ms is not None else '-'} ms")
    print(f"  policy    sha256 {s.policy_sha256}")
    print(f"  user      {s.user}   session {s.session}")
    if s.tool_call_id:
        print(f"  tool call {s.tool_call_id}")
    if s.marks:
        print(f"  marks     {', '.join(s.marks)}")
    for p in s.denied_paths:
        print(f"  denied    {p}")
    for r in s.requests:
        print(f"  request   {r.get('decision', '?'):5} {r.get('method', '')} {r.get('scheme', '')}://"
              f"{r.get('host', '')}{r.get('path', '')} -> {r.get('status', '-')}  ({r.get('rule', '')})")
    return 0


# --- fsck --------------------------------------------------------------------------------

def cmd_fsck(args):
    project = find_project()
    j = _journal(project)
    problems = j.verify() if j else []
    if args.json:
        _out({"ok": not problems, "problems": problems})
    else:
        for p in problems:
            print(p)
        print("fsck: ok" if not problems else f"fsck: {len(problems)} problem(s)")
    return 1 if problems else 0


# --- policy ------------------------------------------------------------------------------

def cmd_policy(args):
    from .policy import PolicyError, json_schema, load_policy, render
    if args.policy_cmd == "schema":
        _out(json_schema())
        return 0
    project = find_project()
    try:
        pol = load_policy(project.policy)
    except PolicyError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    if args.policy_cmd == "check":
        print(f"{project.policy}: ok (sha256 {pol.sha256[:12]})")
    elif args.json:
        _out(pol.to_json())
    else:
        sys.stdout.write(render(pol))
    return 0


# --- doctor ------------------------------------------------------------------------------

def cmd_doctor(args):
    from .doctor import run_checks
    checks = run_checks()
    if args.json:
        _out([c.__dict__ for c in checks])
    else:
        for c in checks:
            mark = "ok  " if c.ok else ("MISS" if c.required else "warn")
            print(f"{mark}  {c.name}: {c.detail}")
            if not c.ok and c.fix:
                print(f"      fix: {c.fix}")
    return 1 if any(c.required and not c.ok for c in checks) else 0


# --- daemon (plumbing) -------------------------------------------------------------------

def cmd_daemon(args):
    from .daemon.client import DaemonError, connect
    project = find_project()
    try:
        conn = connect(project, start=args.daemon_cmd == "status")
    except DaemonError as e:
        if args.daemon_cmd == "stop":
            print("no daemon running")
            return 0
        print(f"envgit: {e}", file=sys.stderr)
        return 1
    _out(conn.request({"op": args.daemon_cmd}))
    return 0
