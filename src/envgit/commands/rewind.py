"""rewind: bring the directory back to the snapshot after a step, or undo the last rewind (the
daemon does the work; daemon/rewind.py says in which order, so that nothing is ever lost)."""

import os
import sys

from ..inert import inert
from ..paths import find_project
from ..view.errors import Refused
from ..view.requests import rewind_message as message
from . import STEP_HELP, Usage, ask_daemon, command, json_flag, open_journal, out, resolve_step, step_ref
from .timeline import pages_way

TOPS_SHOWN = 15             # top-level names in a plan's summary; the rest in one line


def add_parsers(sub, argparse):
    s = command(
        sub, "rewind", help="bring the directory back to the snapshot after a step (or undo a rewind)",
        example=["envgit rewind last~1 --dry-run", "envgit rewind 12 --yes", "envgit rewind --undo"],
        usage="envgit rewind (STEP | --undo) [--yes] [--dry-run] [--policy] [--json] [-- PATH…]",
        description="Bring the directory back to the snapshot after STEP. Every rewind first\n"
                    "records the directory as it is (edits made outside envgit included), so\n"
                    "`envgit rewind --undo` gives it back exactly. envgit.yaml is left as it is\n"
                    "unless --policy is given.")
    s.add_argument("step", nargs="?", type=step_ref, help=STEP_HELP)
    s.add_argument("--undo", action="store_true",
                   help="go back to where the last rewind started (outside edits included)")
    s.add_argument("--yes", "-y", action="store_true", help="do not ask")
    s.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    s.add_argument("--policy", action="store_true",
                   help="restore envgit.yaml too (by default the policy is left as it is)")
    s.set_defaults(paths=[], fn=cmd_rewind)
    json_flag(s)


# --- rewind ------------------------------------------------------------------------------

def cmd_rewind(args):
    project = find_project()
    if args.undo == (args.step is not None):
        raise Usage("give a step to rewind to, or --undo (not both): envgit rewind last~1")
    n = None if args.undo else resolve_step(open_journal(project), args.step)
    # the paths as ls, cat and restore take them: inside the project
    from .snapshot import _rel_path
    paths = [os.fsdecode(_rel_path(x)) for x in args.paths]
    msg = message(n, args.undo, [] if "" in paths else paths, args.policy)    # "." is all of it
    preview = ask_daemon(project, msg)
    what = _what(preview)
    if not args.json:
        _print_preview(preview, what)
    memory = (preview.get("memory") or {}).get("available")     # backend: vm
    done = confirm_and_apply(project, msg, args, preview, bool(memory),
                             f"nothing to change: the directory already is as it was {what}",
                             f"rewind to {what}?", "rewind")
    if isinstance(done, int):
        return done
    c = done["counts"]
    print(f"rewound to {what}: {c['write']} written, {c['delete']} deleted "
          f"(recorded as step {done['rewind_step']}); undo: `envgit rewind --undo` "
          f"or `envgit rewind {done['undo_step']}`")
    mem = done.get("memory")
    if mem:
        print(f"the VM's memory and processes are back as at the end of step {mem['from_step']} "
              f"({mem['restore_ms']:.0f} ms to running{pages_way(mem)})" if mem.get("restored")
              else f"the VM's memory was not restored: {inert(str(mem.get('reason')))}")
    return 0


def _what(p) -> str:
    if p.get("undoes") is not None:
        return f"where rewind step {p['undoes']} started" + (f" (step {p['step']})" if p.get("step") else "")
    return f"step {p['step']}"


def print_plan(p) -> None:
    """What a restore plan will do, as rewind and adopt (adopt.py) preview it: the outside
    edits recorded first, the paths written and deleted (or their summary), the paths kept."""
    c = p["counts"]
    if p.get("outside"):
        o = p["outside"]
        print(f"edits made outside envgit since the last step (+{o['added']} ~{o['modified']} "
              f"-{o['deleted']}) are recorded first, as a step of their own: the undo point")
    if c["write"] + c["delete"] <= 20 and p["listed_whole"]:
        for title, items in (("write", p["write"]), ("delete", p["delete"])):
            if items:
                print(f"{title} ({len(items)}):")
                for i in items:
                    print(f"  {inert(i['path'])}")
    else:
        _print_summary(p)
    for k in p["keep"]:
        print(f"keep {inert(k['path'])}: {inert(k['reason'])}")


def _print_preview(p, what):
    c = p["counts"]
    print(f"rewind to {what} (tree {p['target_tree'][:12]}): {c['write']} to write, "
          f"{c['delete']} to delete")
    print_plan(p)
    if p["policy"]["differs"]:
        print("envgit.yaml differs from the one at the target: "
              + ("it is restored (--policy)" if p["policy"]["restored"]
                 else "left as it is (yours); --policy restores it"))
    mem = p.get("memory")
    if mem:
        print(f"the VM's memory and processes come back as at the end of step {mem['step']}"
              if mem["available"] else f"step {mem['step']} has no memory snapshot: files only")
    for w in p["warnings"]:
        print(f"warning: {inert(w)}")


def _print_summary(p):
    """Counts by top-level name, `.git` as git sees it, instead of every path."""
    tops = sorted(p["by_top"].items(), key=lambda kv: -(kv[1]["write"] + kv[1]["delete"]))
    width = min(max((len(t) for t, _ in tops), default=0) + 1, 40)
    for top, n in tops[:TOPS_SHOWN]:
        name = top + ("/" if n.get("dir") else "")
        counts = ", ".join(f"{n[k]} to {k}" for k in ("write", "delete") if n[k]) or "directory only"
        print(f"  {inert(name):<{width}}  {counts}")
    if len(tops) > TOPS_SHOWN:
        rest = tops[TOPS_SHOWN:]
        print(f"  … and {len(rest)} more: {sum(n['write'] for _, n in rest)} to write, "
              f"{sum(n['delete'] for _, n in rest)} to delete")
    for repo in p.get("git") or []:
        for line in repo.get("lines", []):
            print(f"  {inert(line)}")


def confirm_and_apply(project, msg, args, preview, more_work: bool, nothing: str, question: str,
                      verb: str) -> "dict | int":
    """After a restore's preview (rewind, adopt.py): with --dry-run, or when the plan writes
    nothing (and `more_work` is false), the preview (--json) or `nothing`, and exit 0; else
    `question` on the terminal (unless --yes), then the daemon applies `msg`. Its reply to
    print, or the exit code when nothing is left to print (--json printed it; the person said no)."""
    if args.dry_run or not (preview["counts"]["write"] or preview["counts"]["delete"] or more_work):
        if args.json:
            out(preview)
        elif not args.dry_run:
            print(nothing)
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            raise Usage(f"not a terminal; pass --yes to {verb} without asking")
        answer = input(f"{question} [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing changed")
            return 1
    try:
        done = ask_daemon(project, {**msg, "apply": True})
    except Refused as e:                # refused or failed while applying: exit 1 (or its own)
        raise Usage(str(e), e.code or 1) from None
    if args.json:
        out(done)
        return 0
    return done
