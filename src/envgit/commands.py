"""What each porcelain command does: call the part that owns the work, render its answer."""

import json
import os
import sys

from .inert import inert, inert_json, inert_line
from .paths import NoProject, find_project


# Exit codes of operational failures (cli.py's docstring lists them all): stable, so scripts
# can tell "fix the command" from "the daemon is gone" from "the store or journal is damaged".
EXIT_FAILED, EXIT_USAGE, EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL = 1, 2, 3, 4, 5


def dispatch(args) -> int:
    fn = globals()["cmd_" + args.cmd]
    try:
        return fn(args)
    except NoProject as e:
        print(f"envgit: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        said = operational(e)
        if said is None:
            raise                       # a bug: its traceback is what a report needs
        text, code = said
        print(f"envgit: {text}", file=sys.stderr)
        return code


def operational(e: Exception):
    """(one line with the fix, exit code) for a failure of the machine, the daemon or the
    data rather than of envgit's code; None for anything else."""
    import sqlite3
    from .daemon.client import DaemonError
    from .journal import JournalError
    if isinstance(e, DaemonError):
        return (f"{e}; run the command again (it starts a new session daemon)", EXIT_DAEMON)
    if isinstance(e, JournalError):
        return (f"{e}; `envgit fsck` says what is damaged", EXIT_JOURNAL)
    if isinstance(e, sqlite3.DatabaseError):
        return (f"the journal (.envgit/journal.sqlite) cannot be read: {e}; `envgit fsck` says "
                "what is damaged, `envgit fsck --repair` keeps every entry it can read", EXIT_JOURNAL)
    snapshot = sys.modules.get("envgit.snapshot")    # loaded only by commands that use the store
    if snapshot is not None and isinstance(e, (snapshot.StoreError, snapshot.CorruptObject)):
        return (f"{e}; `envgit fsck` lists what is damaged in the snapshot store", EXIT_STORE)
    if isinstance(e, OSError):
        return (f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), EXIT_FAILED)
    return None


def _out(obj):
    print(inert_json(json.dumps(obj, indent=2, ensure_ascii=False)))


# Everything a step, an agent or a server chose (names, paths, refs, hosts, command lines,
# marks) goes through inert() before it is printed: see inert.py.


# --- demo --------------------------------------------------------------------------------

def cmd_demo(args):
    from .demo import main
    return main(args)


# --- init --------------------------------------------------------------------------------

def cmd_init(args):
    from .policy import defaults
    root = os.path.realpath(os.getcwd())
    home = os.path.realpath(os.path.expanduser("~"))
    if root in ("/", home) and not args.force:
        print(f"envgit: {root} is {'/' if root == '/' else 'your home directory'}: as a project, all of it "
              "would be visible and writable to every step; run `envgit init` in a project's "
              "directory (or pass --force)", file=sys.stderr)
        return 2
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
    text = " ".join(shlex.join(argv).split())      # one line, whatever the script held
    return text if len(text) <= width else text[:width - 1] + "…"


def cmd_log(args):
    project = find_project()
    j = _journal(project)
    steps = j.steps(session=args.session, last=args.n or None) if j else []
    if args.json:
        _out([s.to_json() for s in steps])
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


# --- fsck --------------------------------------------------------------------------------

def cmd_fsck(args):
    project = find_project()
    if args.repair:
        return _fsck_repair(project)
    import sqlite3
    try:
        j = _journal(project)
        problems = j.verify() if j else []
        trees = j.live_trees() if j else []
    except sqlite3.DatabaseError as e:
        return _fsck_damaged(project, e, args)
    if os.path.isdir(project.state_path("objects")):
        from .snapshot import Store
        problems += Store(project.state_path("objects")).fsck(trees)
    if args.json:
        _out({"ok": not problems, "problems": problems, "snapshots_checked": len(trees)})
    else:
        for p in problems:
            print(inert(p))
        print(f"fsck: ok ({len(trees)} snapshot(s), journal chain intact)" if not problems
              else f"fsck: {len(problems)} problem(s)")
    return 1 if problems else 0


def _damage(project):
    from .journal import HeadRecord
    from .journal.salvage import inspect
    head = HeadRecord(project.state_path("journal.head")).read() or {}
    return inspect(project.journal, head.get("seq", 0))


def _fsck_damaged(project, error, args):
    """The journal file itself is damaged: say what, and how to go on."""
    d = _damage(project)
    if not d.damaged:               # it read whole this time: the error was elsewhere
        d.error = str(error)
    text = d.summary(".envgit/journal.sqlite")
    if args.json:
        _out({"ok": False, "problems": [text], "snapshots_checked": 0})
    else:
        print(inert(text))
        print("fsck: the journal is damaged")
    return 1


def _fsck_repair(project):
    """`fsck --repair`: rebuild a damaged journal.sqlite from every readable row (no daemon may
    hold it), record what could not be kept, then verify as fsck does."""
    import fcntl
    from .journal import Journal
    from .journal.salvage import ranges, rebuild
    if not os.path.exists(project.journal):
        print("fsck: no journal yet; nothing to repair")
        return 0
    with open(project.state_path("daemon.lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            print("envgit: a session daemon holds the journal; `envgit daemon stop`, then "
                  "`envgit fsck --repair`", file=sys.stderr)
            return EXIT_DAEMON
        d = _damage(project)
        if d.damaged:
            kept_as = rebuild(project.journal, d)
            j = Journal(project.journal)            # records a lost tail itself, if any
            j.rebuild_open_steps()
            if d.unreadable:
                j.append(0, "lost", {
                    "entries": [d.unreadable[0], d.unreadable[-1]], "missing": d.unreadable,
                    "last_step": j.floor, "head_hash": "",
                    "reason": f"journal.sqlite was damaged ({d.error}); fsck --repair kept "
                              f"{len(d.rows)} entries and could not read entries {ranges(d.unreadable)}"})
            j.close()
            print(f"fsck: rebuilt the journal: kept {len(d.rows)} of {d.highest} entries"
                  + (f"; could not keep entries {ranges(d.unreadable)} (recorded as lost)" if d.unreadable else "")
                  + f"; the damaged file is kept as {os.path.basename(kept_as)}")
        else:
            j = Journal(project.journal)
            problems = [p for p in j.verify() if "open steps" in p]
            if problems:
                j.rebuild_open_steps()
                print("fsck: rebuilt the table of open steps from the entries")
            j.close()
    return cmd_fsck(argparse_namespace(json=False, repair=False))


def argparse_namespace(**kw):
    import argparse
    return argparse.Namespace(**kw)


# --- policy ------------------------------------------------------------------------------

def cmd_policy(args):
    from .policy import PolicyError, json_schema, load_policy, render
    if args.policy_cmd == "schema":
        _out(json_schema())
        return 0
    if args.policy_cmd == "protected":
        from .policy.defaults import render_escape_routes
        sys.stdout.write(render_escape_routes())
        return 0
    project = find_project()
    try:
        pol = load_policy(project.policy)
    except PolicyError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    if args.policy_cmd == "check":
        print(f"{project.policy}: ok (sha256 {pol.sha256[:12]})")
        from .sandbox.tracked import tracked_denied, warning
        tracked = tracked_denied(pol, project.root, os.path.expanduser("~"))
        if tracked:
            print(f"warning: {inert(warning(tracked))}")
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


# --- diff --------------------------------------------------------------------------------

def _step_tree(j, n):
    s = j.step(n) if j else None
    if s is None:
        raise _Usage(f"no step {n}; `envgit log` lists them")
    if not s.snapshot or not s.snapshot.get("tree"):
        raise _Usage(f"step {n} has no snapshot")
    return s.snapshot["tree"]


class _Usage(Exception):
    def __init__(self, text, code=None):
        super().__init__(text)
        self.code = code        # an operational exit code (EXIT_DAEMON…) the daemon gave, if any


def _daemon(project, msg):
    from .daemon.client import connect
    conn = connect(project)
    conn.on_push = lambda f: print(f"envgit: {f['text']}", file=sys.stderr) if f.get("push") == "progress" else None
    reply = conn.request(msg)
    if "error" in reply:
        code = reply.get("exit")
        raise _Usage(reply["error"].removeprefix("envgit: "),
                     code if code in (EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL) else None)
    return reply


def cmd_diff(args):
    from .daemon.snapshots import display
    from .snapshot import Store
    project = find_project()
    j = _journal(project)
    try:
        latest = j.last_snapshot_step() if j and args.a is None else None
        if args.a is None and latest is None:
            raise _Usage("no snapshots yet: envgit run -- CMD takes one after every step")
        a_name = f"step {args.a}" if args.a is not None else f"step {latest.id}"
        a = _step_tree(j, args.a) if args.a is not None else latest.snapshot["tree"]
        if args.b is not None:
            b, b_name = _step_tree(j, args.b), f"step {args.b}"
        else:
            b, b_name = _daemon(project, {"op": "snapshot"})["tree"], "working tree"
    except _Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    store = Store(project.state_path("objects"))
    changes = store.diff(a, b)
    if args.paths:
        want = [p.rstrip("/") for p in args.paths]
        changes = [c for c in changes if any(display(c.path) == w or display(c.path).startswith(w + "/")
                                             for w in want)]
    if args.json:
        _out({"from": a_name, "to": b_name, "from_tree": a, "to_tree": b, "changes": [
            {"path": display(c.path), "status": c.status, "old_size": c.old_size, "new_size": c.new_size,
             "old_type": c.old_type, "new_type": c.new_type} for c in changes]})
        return 0
    files = [c for c in changes if (c.new_type or c.old_type) != "dir"]
    print(f"# {a_name} -> {b_name}: {len(files)} file(s) changed")
    for c in changes:
        if (c.new_type or c.old_type) == "dir" and args.stat:
            continue
        mark = {"added": "A", "deleted": "D", "modified": "M", "type-changed": "T"}[c.status]
        sizes = f"{c.old_size if c.old_size is not None else '-'} -> {c.new_size if c.new_size is not None else '-'}"
        print(f"{mark}  {inert(display(c.path))}  ({sizes} bytes)")
        if not args.stat:
            _unified(store, a, b, c)
    return 0


def _unified(store, a, b, c):
    import difflib
    from .daemon.snapshots import display
    if "file" not in (c.old_type, c.new_type) and "exec" not in (c.old_type, c.new_type):
        return
    def text(tree, present):
        if not present:
            return []
        data = store.read_file(tree, c.path)
        if b"\0" in data[:8192] or len(data) > 1 << 20:
            raise ValueError
        return data.decode("utf-8").splitlines(keepends=True)
    try:
        old = text(a, c.old_type in ("file", "exec"))
        new = text(b, c.new_type in ("file", "exec"))
    except (ValueError, UnicodeDecodeError):
        print("   (binary or large: contents not shown)")
        return
    name = inert(display(c.path))
    sys.stdout.writelines(inert_line(line) for line in difflib.unified_diff(old, new, f"a/{name}", f"b/{name}"))


# --- rewind ------------------------------------------------------------------------------

def cmd_rewind(args):
    project = find_project()
    msg = {"op": "rewind", "step": args.step, "paths": args.paths or None, "uid": os.getuid()}
    try:
        preview = _daemon(project, msg)
    except _Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return e.code or 2
    if not args.json:
        _print_preview(preview, args.step)
    if args.dry_run:
        if args.json:
            _out(preview)
        return 0
    if not (preview["write"] or preview["delete"]):
        if args.json:
            _out(preview)
        else:
            print("nothing to change: the directory already is as it was after step "
                  f"{args.step}")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            print("envgit: not a terminal; pass --yes to rewind without asking", file=sys.stderr)
            return 2
        answer = input(f"rewind to step {args.step}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing changed")
            return 1
    try:
        done = _daemon(project, {**msg, "apply": True})
    except _Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return e.code or 1
    if args.json:
        _out(done)
        return 0
    print(f"rewound to step {args.step}: {len(done['write'])} written, {len(done['delete'])} deleted "
          f"(recorded as step {done['rewind_step']}; undo with `envgit rewind {done['rewind_step'] - 1}`)")
    return 0


def _print_preview(p, n):
    def show(title, items, key="path"):
        if not items:
            return
        print(f"{title} ({len(items)}):")
        for i in items[:20]:
            print(f"  {inert(i[key])}")
        if len(items) > 20:
            print(f"  … and {len(items) - 20} more")
    print(f"rewind to step {n} (tree {p['target_tree'][:12]}):")
    show("write", p["write"])
    show("delete", p["delete"])
    show("keep (left out of snapshots, untouched)", p["keep"])
    for w in p["warnings"]:
        print(f"warning: {inert(w)}")


# --- gc ----------------------------------------------------------------------------------

def _duration_s(text):
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if not text or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise _Usage(f"--keep-within {text!r}: write a number (1 or more) and a unit, e.g. 7d, 12h, 30m")
    return int(text[:-1]) * units[text[-1]]


def cmd_gc(args):
    project = find_project()
    try:
        within = _duration_s(args.keep_within) if args.keep_within else None
        print("gc: marking what kept steps reach, then repacking…", file=sys.stderr)
        r = _daemon(project, {"op": "gc", "keep_last": args.keep_last, "keep_within_s": within})
    except _Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return e.code or 2
    if args.json:
        _out(r)
    else:
        print(f"gc: dropped the snapshots of {len(r['dropped'])} step(s), freed {r['freed']} bytes")
    return 0


# --- pending / approve / deny ------------------------------------------------------------

def cmd_pending(args):
    from .daemon.client import DaemonError, connect
    project = find_project()
    try:
        asks = connect(project, start=False).request({"op": "pending"})["asks"]
    except DaemonError:
        asks = []                       # no daemon: nothing can be waiting
    if args.json:
        _out(asks)
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
    from .daemon.client import DaemonError, connect
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
