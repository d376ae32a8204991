"""rewind: bring the directory back to the snapshot after a step (the daemon does the work)."""

import os
import sys

from ..inert import inert
from ..paths import find_project
from . import Usage, ask_daemon, out


def add_parsers(sub, argparse):
    s = sub.add_parser("rewind", help="bring the directory back to the snapshot after step N",
                       usage="envgit rewind N [--yes] [--dry-run] [--json] [-- PATH…]")
    s.add_argument("step", type=int)
    s.add_argument("--yes", "-y", action="store_true", help="do not ask")
    s.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    s.set_defaults(paths=[], fn=cmd_rewind)
    s.add_argument("--json", action="store_true")


# --- rewind ------------------------------------------------------------------------------

def cmd_rewind(args):
    project = find_project()
    msg = {"op": "rewind", "step": args.step, "paths": args.paths or None, "uid": os.getuid()}
    try:
        preview = ask_daemon(project, msg)
    except Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return e.code or 2
    if not args.json:
        _print_preview(preview, args.step)
    if args.dry_run:
        if args.json:
            out(preview)
        return 0
    if not (preview["write"] or preview["delete"]):
        if args.json:
            out(preview)
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
        done = ask_daemon(project, {**msg, "apply": True})
    except Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return e.code or 1
    if args.json:
        out(done)
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
