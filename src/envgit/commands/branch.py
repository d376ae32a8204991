"""fork, branches, branch rm: environment branches (issue 27; docs/ARCHITECTURE.md, "Branches").

A fork branch is a working tree of the project at a step, a project of its own beside it
(branch/fork.py); a rewound branch is the steps a rewind stepped over (branch/rewound.py).
The main project records its forks in `.envgit/branches/` (branch/registry.py)."""

import os

from ..inert import inert
from ..paths import Project, find_project
from . import STEP_HELP, Usage, command, json_flag, open_journal, out, progress, step_ref

MAX_FORK = 64


def add_parsers(sub, argparse):
    s = command(sub, "fork", help="make N working trees of the project at a step, each a project "
                "of its own sharing the store (environment branches)",
                example=["envgit fork 3", "envgit fork 2 --at 12 --into /tmp/tries"],
                usage="envgit fork N [--at STEP] [--into DIR] [--json]")
    s.add_argument("count", type=_count, metavar="N", help=f"how many branches (1 to {MAX_FORK})")
    s.add_argument("--at", type=step_ref, default="last", metavar="STEP", help=f"{STEP_HELP} (default: last)")
    s.add_argument("--into", metavar="DIR", help="the directory the branches are made in, each "
                   "as NAME.envgit-ID (default: the project's parent directory)")
    json_flag(s)
    s.set_defaults(fn=cmd_fork)

    s = command(sub, "branches", help="the project's branches: forks and what rewinds stepped over",
                example=["envgit branches", "envgit branches --json"])
    json_flag(s)
    s.set_defaults(fn=cmd_branches)

    s = command(sub, "branch", help="remove a branch (envgit branch rm ID)",
                example=["envgit branch rm 2", "envgit branch rm r14", "envgit branch rm 3 --force"])
    verbs = s.add_subparsers(dest="verb", metavar="rm", required=True)
    rm = command(verbs, "rm", help="remove a fork branch (its directory and record) or a rewound "
                 "branch (its steps no longer kept from gc)",
                 example=["envgit branch rm 2", "envgit branch rm r14", "envgit branch rm 3 --force"])
    rm.add_argument("id", metavar="ID", help="a fork's number, or r<R> for a rewound branch")
    rm.add_argument("--force", action="store_true", help="remove a fork branch even when its "
                    "directory has changes since its last step")
    json_flag(rm)
    rm.set_defaults(fn=cmd_branch_rm)


def _count(text):
    import argparse
    if not text.isdigit() or not 1 <= int(text) <= MAX_FORK:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of branches from 1 to {MAX_FORK}")
    return int(text)


# --- fork ---------------------------------------------------------------------------------

def cmd_fork(args):
    from ..branch import fork as forking
    from .snapshot import step_tree
    project = find_project()
    j = open_journal(project)
    if j is None:
        raise Usage("the project has no step yet; run one (`envgit run true`) and fork from it")
    n, tree = step_tree(j, args.at)
    j.close()
    try:
        with progress(None, "path", "fork") as bar:
            made = forking.fork(project, n, tree, args.count, args.into,
                                lambda done, total: (setattr(bar, "total", total), bar.update(done - bar.n)))
    except forking.ForkError as e:
        raise Usage(str(e)) from None
    if args.json:
        out({"step": n, "tree": tree, "branches": [{"id": r["id"], "dir": r["dir"]} for r in made]})
        return 0
    for r in made:
        print(inert(f"branch {r['id']}: {r['dir']}"))
    print(f"forked from step {n} (tree {tree[:12]}); `cd DIR && envgit run …` works there")
    return 0


# --- branches -----------------------------------------------------------------------------

def listing(project) -> list[dict]:
    """Every branch, forks first (by id), then rewound branches (by rewind step). Keys:
    docs/FORMAT.md, "envgit branches --json"."""
    from ..branch import fork as forking
    from ..branch import registry, rewound
    forking.recover(project)
    rows = []
    for rec in registry.forks(project):
        rows.append(_fork_row(rec))
    j = open_journal(project)
    steps = j.steps() if j is not None else []
    gone = rewound.removed(project)
    for b in rewound.rewound(steps):
        if b["rewind_step"] in gone:
            continue
        inside = [s for s in steps if b["steps"][0] <= s.id <= b["steps"][1]]
        rows.append({"id": b["id"], "kind": "rewound", "dir": None, "exists": None,
                     "from_step": b["to_step"], "from_tree": None, "tree": b["tree"],
                     "steps": len(inside), "step_range": b["steps"], "last_step": b["steps"][1],
                     "marks": _marks(inside), "running": None})
    if j is not None:
        j.close()
    return rows


def _fork_row(rec: dict) -> dict:
    from .ps import running
    d = rec["dir"]
    row = {"id": rec["id"], "kind": "fork", "dir": d, "exists": os.path.isdir(os.path.join(d, ".envgit")),
           "from_step": rec["from_step"], "from_tree": rec["from_tree"], "tree": None,
           "steps": None, "step_range": None, "last_step": None, "marks": [], "running": None}
    if not row["exists"]:
        return row
    branch = Project(d)
    j = open_journal(branch)
    steps = j.steps() if j is not None else []
    if j is not None:
        last = j.last_snapshot_step()
        row["tree"] = last.snapshot["tree"] if last is not None and last.snapshot else rec["from_tree"]
        j.close()
    else:
        row["tree"] = rec["from_tree"]
    row["steps"] = len(steps)
    row["step_range"] = [steps[0].id, steps[-1].id] if steps else None
    row["last_step"] = steps[-1].id if steps else None
    row["marks"] = _marks(steps)
    row["running"] = [s["id"] for s in running(branch)]
    return row


def _marks(steps) -> list[str]:
    seen: dict[str, None] = {}
    for s in steps:
        for m in s.marks or ():
            seen.setdefault(str(m).split(":")[0], None)
        if s.escape_routes:
            seen.setdefault("escape-route", None)
        if s.irreversible:
            seen.setdefault("irreversible", None)
    return sorted(seen)


def cmd_branches(args):
    from ..branch import registry
    project = find_project()
    rows = listing(project)
    try:
        parent = registry.parent_of(project)
    except registry.BadRecord as e:
        raise Usage(str(e)) from None
    if args.json:
        out({"branches": rows, "parent": parent})
        return 0
    if parent is not None:
        print(inert(f"this project is branch {parent['id']} of {parent['parent']} (forked at step "
                    f"{parent['from_step']})"))
    if not rows:
        print("no branches; `envgit fork N` makes some")
        return 0
    for r in rows:
        if r["kind"] == "fork":
            if not r["exists"]:
                state = "directory missing (`envgit branch rm " + str(r["id"]) + "` drops the record)"
            else:
                state = (f"{r['steps']} step(s)" + (f", last {r['last_step']}" if r["last_step"] else "")
                         + (f", running: {', '.join(map(str, r['running']))}" if r["running"] else ""))
            where = r["dir"]
        else:
            state = f"steps {r['step_range'][0]}-{r['step_range'][1]} ({r['steps']})"
            where = f"tree {r['tree'][:12]}"
        marks = f"  [{', '.join(r['marks'])}]" if r["marks"] else ""
        print(inert(f"{str(r['id']):>5}  {r['kind']:<7}  from step {r['from_step']}  {state}{marks}  {where}"))
    return 0


# --- branch rm ----------------------------------------------------------------------------

def cmd_branch_rm(args):
    from ..branch import rewound
    project = find_project()
    r = rewound.parse_id(args.id)
    if r is not None:
        j = open_journal(project)
        ids = {b["rewind_step"] for b in rewound.rewound(j.steps() if j is not None else [])}
        if j is not None:
            j.close()
        if r not in ids:
            raise Usage(f"no rewound branch {args.id}; `envgit branches` lists them")
        fresh = rewound.remove(project, r)
        return _said(args, {"id": args.id, "kind": "rewound", "dir": None, "removed": fresh},
                     f"removed branch {args.id}" + ("" if fresh else " (it was already)"))
    if not args.id.isdigit():
        raise Usage(f"{args.id!r}: give a fork's number or r<R>; `envgit branches` lists them")
    return _rm_fork(args, project, int(args.id))


def _rm_fork(args, project, branch_id: int):
    from ..branch import fork as forking
    from ..branch import registry
    from .ps import running
    forking.recover(project)
    with registry.locked(project):
        rec = registry.fork(project, branch_id)
        if rec is None:
            raise Usage(f"no fork branch {branch_id}; `envgit branches` lists them")
        d = rec["dir"]
        owned = _owned(project, d, branch_id)
        if owned:
            branch = Project(d)
            live = running(branch)
            if live:
                raise Usage(f"a step runs in branch {branch_id} (step {', '.join(str(s['id']) for s in live)}); "
                            "wait for it, or stop it, then remove the branch")
            if not args.force:
                changed = _changed_since_last_step(branch, rec)
                if changed:
                    raise Usage(f"branch {branch_id} ({d}) has changes since its last step ({changed}); "
                                "`envgit adopt` or run a step there to keep them, or --force to remove it anyway")
            _stop_daemon(branch)
        # the record first (never one naming nothing), then the directory out of its name at
        # once (never a half-removed branch under it), then its contents
        registry.remove(project, branch_id)
        if owned:
            gone = os.path.join(os.path.dirname(d), f".{os.path.basename(d)}.removing-{os.urandom(4).hex()}")
            os.rename(d, gone)
            try:
                forking.remove_tree(gone)
            except OSError as e:
                raise Usage(f"branch {branch_id} is removed, but not all of its files: {e}; "
                            f"remove {gone} yourself", 1) from None
    return _said(args, {"id": branch_id, "kind": "fork", "dir": d, "removed": True},
                 f"removed branch {branch_id}" + (f" and {d}" if owned else " (its directory was gone)"))


def _owned(project, d: str, branch_id: int) -> bool:
    """The directory is this project's branch `branch_id` (never remove anything else)."""
    from ..branch import registry
    try:
        mine = registry.parent_of(d)
    except registry.BadRecord:
        return False
    return mine is not None and mine["parent"] == os.path.realpath(project.root) and mine["id"] == branch_id


def _changed_since_last_step(branch, rec) -> str | None:
    """What the branch's directory holds that its last step (or the fork point) does not:
    the count of paths changed, or None. Its own daemon snapshots it (the store's one writer)."""
    from . import ask_daemon
    j = open_journal(branch)
    last = j.last_snapshot_step() if j is not None else None
    if j is not None:
        j.close()
    since = last.snapshot["tree"] if last is not None and last.snapshot else rec["from_tree"]
    now = ask_daemon(branch, {"op": "snapshot"})["tree"]
    if now == since:
        return None
    from ..snapshot import Store
    store = Store(branch.state_path("objects"))
    try:
        n = len(store.diff(since, now))
    finally:
        store.close()
    return f"{n} path(s) differ from {'step ' + str(last.id) if last is not None else 'the fork point'}"


def _stop_daemon(branch) -> None:
    from ..daemon.client import DaemonError, connect
    try:
        conn = connect(branch, start=False, any_build=True)
    except DaemonError:
        return
    try:
        conn.request({"op": "stop"})
    except Exception:
        pass
    finally:
        conn.close()
    import time
    deadline = time.monotonic() + 10
    while os.path.exists(branch.socket) and time.monotonic() < deadline:
        time.sleep(0.05)


def _said(args, obj, text):
    if args.json:
        out(obj)
    else:
        print(inert(text))
    return 0
