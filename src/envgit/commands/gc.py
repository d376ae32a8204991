"""gc: drop snapshots outside a retention rule, and unreachable objects."""

from ..paths import find_project
from . import Usage, ask_daemon, command, json_flag, out


def add_parsers(sub, argparse):
    s = command(sub, "gc", help="drop snapshots outside a retention rule, and unreachable objects",
                example=["envgit gc --keep-last 50", "envgit gc --keep-within 7d"])
    s.add_argument("--keep-last", type=_at_least_one(argparse), metavar="N",
                   help="keep the snapshots of the last N steps (N >= 1)")
    s.add_argument("--keep-within", help="keep snapshots younger than this (e.g. 7d, 12h, 30m)")
    json_flag(s)
    s.set_defaults(fn=cmd_gc)


def _at_least_one(argparse):
    """An argparse type: a whole number, 1 or more (`--keep-last -2` is refused, not obeyed)."""
    def count(text):
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
        return n
    return count


# --- gc ----------------------------------------------------------------------------------

def _duration_s(text):
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if not text or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise Usage(f"--keep-within {text!r}: write a number (1 or more) and a unit, e.g. 7d, 12h, 30m")
    return int(text[:-1]) * units[text[-1]]


def cmd_gc(args):
    project = find_project()
    within = _duration_s(args.keep_within) if args.keep_within else None
    r = ask_daemon(project, {"op": "gc", "keep_last": args.keep_last, "keep_within_s": within})
    if args.json:
        out({"dropped": r["dropped"], "kept": r["kept"], "freed": r["freed"],
             "kept_by_branches": r.get("kept_by_branches", []),
             "memory_dropped": r.get("memory_dropped", []), "memory_freed": r.get("memory_freed", 0)})
    else:
        print(f"gc: dropped the snapshots of {len(r['dropped'])} step(s), freed {r['freed']} bytes")
        if r.get("kept_by_branches"):
            print(f"gc: kept the snapshots of {len(r['kept_by_branches'])} step(s) that branches reach "
                  "(`envgit branches` lists them; `envgit branch rm ID` lets gc drop them)")
        if r.get("memory_dropped"):
            print(f"gc: removed {len(r['memory_dropped'])} VM memory snapshot(s), freed "
                  f"{r['memory_freed']} bytes")
    return 0
