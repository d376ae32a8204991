"""Remembered grants (daemon/grants.py): list them, revoke one."""

import os
import time

from ..inert import inert
from ..paths import find_project
from ..view.names import grant_line
from . import Usage, ask_daemon, command, json_flag, open_journal, out


def add_parsers(sub, argparse):
    s = command(sub, "grants", help="remembered approvals (`envgit approve ID --remember`): list, revoke",
                example=["envgit grants", "envgit grants --all --json", "envgit grants revoke g2"])
    s.add_argument("action", nargs="?", choices=["revoke"], help="revoke: end grant ID now")
    s.add_argument("gid", nargs="?", metavar="ID", help="the grant to revoke (g1, g2, …)")
    s.add_argument("--all", action="store_true", help="also list expired and revoked grants")
    json_flag(s)
    s.set_defaults(fn=cmd_grants)


def _state(g: dict, now: float) -> str:
    if g["revoked"]:
        return "revoked"
    if g["expires_at"] <= now:
        return "expired"
    left = g["expires_at"] - now
    return f"{left / 3600:.1f}h left" if left >= 3600 else f"{left / 60:.0f}m left"


def cmd_grants(args):
    project = find_project()
    if args.action == "revoke":
        if not args.gid:
            raise Usage("give the grant to revoke: envgit grants revoke ID (`envgit grants` lists them)")
        g = ask_daemon(project, {"op": "grant-revoke", "id": args.gid, "uid": os.getuid(),
                                 "how": "envgit grants revoke"})["grant"]
        if args.json:
            out(g)
        else:
            print(f"grant {g['id']} revoked: {grant_line(g)}")
        return 0
    if args.gid:
        raise Usage(f"{args.gid!r}: to end a grant, envgit grants revoke {args.gid}")
    from ..daemon.grants import read_all
    j = open_journal(project)
    grants = [g.to_json() for g in read_all(j)] if j is not None else []
    now = time.time()
    if not args.all:
        grants = [g for g in grants if not g["revoked"] and g["expires_at"] > now]
    if args.json:
        out(grants)
        return 0
    if not grants:
        print("no live grants" + ("" if args.all else " (`envgit grants --all` lists expired and revoked ones)"))
    for g in grants:
        widened = f"  widened by {inert(g['widened']['who'])}" if g["widened"] else ""
        print(f"{g['id']:>4}  {grant_line(g)}  uses {g['uses']}  {_state(g, now)}  by {inert(g['who'])}"
              f" from step {g['step']}{widened}")
    return 0
