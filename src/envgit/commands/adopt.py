"""adopt: the main working tree becomes a branch's tree, as one step, undoable with `envgit
rewind --undo` (the daemon does the work: daemon/adopt.py; an adopt is a rewind to the
branch's tree, previewed and confirmed the same way)."""

import os

from ..inert import inert
from ..paths import Project, find_project
from . import Usage, ask_daemon, command, json_flag
from .rewind import confirm_and_apply, print_plan


def add_parsers(sub, argparse):
    s = command(
        sub, "adopt", help="make the working tree a branch's tree, as one step (undo: rewind --undo)",
        example=["envgit adopt 2 --dry-run", "envgit adopt 2 --yes", "envgit adopt r14"],
        usage="envgit adopt ID [--yes] [--dry-run] [--policy] [--json]",
        description="Make the project's working tree the tree of branch ID (everything its\n"
                    "snapshot has: ignored files, a virtualenv, .git), recorded as one step.\n"
                    "ID is a fork branch's number (`envgit fork`) or r<STEP>, the steps a\n"
                    "rewind stepped over. The directory as it is is recorded first, so\n"
                    "`envgit rewind --undo` gives it back. envgit.yaml is left as it is unless\n"
                    "--policy is given. The branch stays until `envgit branch rm ID`.")
    s.add_argument("branch", metavar="ID", help="a branch: N (a fork) or rN (a rewound branch); "
                   "`envgit branches` lists them")
    s.add_argument("--yes", "-y", action="store_true", help="do not ask")
    s.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    s.add_argument("--policy", action="store_true",
                   help="take the branch's envgit.yaml too (by default the policy is left as it is)")
    s.set_defaults(fn=cmd_adopt)
    json_flag(s)


def cmd_adopt(args):
    project = find_project()
    bid = args.branch.strip()
    msg = {"op": "adopt", "branch": bid, "policy": args.policy, "uid": os.getuid()}
    if bid.isdigit():
        msg["tree"] = _fork_tree(project, int(bid))
    preview = ask_daemon(project, msg)
    if not args.json:
        _print_preview(preview)
    done = confirm_and_apply(project, msg, args, preview, False,
                             f"nothing to change: the directory already is branch {inert(bid)}'s tree",
                             f"adopt branch {inert(bid)}?", "adopt")
    if isinstance(done, int):
        return done
    c = done["counts"]
    print(f"adopted branch {inert(bid)}: {c['write']} written, {c['delete']} deleted (recorded as step "
          f"{done['rewind_step']}); undo: `envgit rewind --undo` or `envgit rewind {done['undo_step']}`; "
          f"the branch stays until `envgit branch rm {inert(bid)}`")
    return 0


def _fork_tree(project, n: int) -> str:
    """Fork branch N's working tree as a tree id in its own store, from its daemon: a snapshot
    taken now, so changes made there since its last step are adopted too. Refused while a step
    runs there (its tree is half-made)."""
    from ..branch import registry
    try:
        rec = registry.fork(project, n)
    except registry.BadRecord as e:
        raise Usage(f"{e}; `envgit branch rm {n}` forgets it") from None
    if rec is None:
        raise Usage(f"no branch {n}; `envgit branches` lists them")
    branch = Project(rec["dir"])
    if not os.path.isfile(branch.policy) or not os.path.isdir(branch.state):
        raise Usage(f"branch {n}'s directory {inert(rec['dir'])} is not an envgit project (moved or "
                    f"deleted?); `envgit branch rm {n}` forgets it")
    live = ask_daemon(branch, {"op": "status"}).get("live") or []
    if live:
        raise Usage(f"step {live[0]} is running in branch {n}; adopt when no step runs there", 1)
    return ask_daemon(branch, {"op": "snapshot"})["tree"]


def _print_preview(p):
    a, c = p["adopt"], p["counts"]
    where = (f"the steps {a['steps'][0]}–{a['steps'][1]} rewind step {a['rewind_step']} stepped over"
             if a["kind"] == "rewound" else f"forked from step {a['from_step']}, in {inert(a['dir'])}")
    print(f"adopt branch {inert(a['branch'])} ({where}; tree {p['target_tree'][:12]}): "
          f"{c['write']} to write, {c['delete']} to delete")
    copied = p.get("copied")
    if copied and copied["copied_objects"]:
        print(f"copied {copied['copied_objects']} object(s) ({copied['copied_bytes']} bytes) from the "
              "branch's store into this project's")
    print_plan(p)
    if p["policy"]["differs"]:
        print("envgit.yaml differs from the branch's: " + ("it is taken (--policy)" if p["policy"]["restored"]
                                                           else "left as it is (yours); --policy takes it"))
    for w in p["warnings"]:
        print(f"warning: {inert(w)}")
