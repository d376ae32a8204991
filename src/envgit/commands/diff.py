"""diff: what changed between two steps, or a step and the working tree.

A repository's `.git` is shown as git sees it (refs moved, commits added and lost, index
changed: snapshot/gitview.py), not as the object files behind it, which `--raw` lists. A path
the policy denies (a `.env`) is listed as changed with its content withheld, unless
`--show-secrets`.
"""

import sys

from ..inert import inert
from ..paths import find_project
from ..view.diffs import Part, unified_lines
from ..view.secrets import Secrets
from . import STEP_HELP, Usage, ask_daemon, command, json_flag, open_journal, out, step_ref
from .snapshot import para, step_tree, withheld_line


def add_parsers(sub, argparse):
    s = command(sub, "diff", help="what changed between two steps, or a step and the working tree",
                example=["envgit diff", "envgit diff last~1 last -- src/", "envgit diff 3 5 --raw --stat"],
                usage="envgit diff [A] [B] [--stat] [--raw] [--show-secrets] [--full] [--json] [-- PATH…]",
                description=para("What changed from step A (default: the last) to step B (default: the "
                "working tree). A repository's .git is shown as git sees it: refs moved, commits "
                "added and commits lost (on no ref any more), the index changed; --raw lists its "
                "files instead. Changes made outside envgit between steps are shown as their own "
                "part. A file the policy denies to steps (a .env) is listed as changed with its "
                "content withheld unless --show-secrets."))
    s.add_argument("a", nargs="?", type=step_ref, help=f"{STEP_HELP} (default: the last one)")
    s.add_argument("b", nargs="?", type=step_ref, help="a later step (default: the working tree)")
    s.add_argument("--stat", action="store_true", help="names and sizes only")
    s.add_argument("--raw", action="store_true",
                   help="list the files under .git (objects, refs, logs, index) instead of git's view")
    s.add_argument("--show-secrets", action="store_true",
                   help="show the content of files the policy denies to steps (deny_read)")
    s.add_argument("--full", action="store_true",
                   help="diff every text file however long it takes (by default a file whose changed "
                   "lines would take difflib long is listed with its line counts only)")
    json_flag(s)
    s.set_defaults(paths=[], fn=cmd_diff)


# --- diff --------------------------------------------------------------------------------

_MARK = {"added": "A", "deleted": "D", "modified": "M", "type-changed": "T"}


def cmd_diff(args):
    from ..snapshot import Store
    project = find_project()
    j = open_journal(project)
    if args.a is None:
        from ..steporder import newest_tree
        latest = newest_tree(j) if j else None      # newest in time, not the highest number
        if latest is None:
            raise Usage("no snapshots yet: envgit run -- CMD takes one after every step")
        a_step, a = latest.step, latest.tree
    else:
        a_step, a = step_tree(j, args.a)
    if args.b is not None:
        b_step, b = step_tree(j, args.b)
    else:
        b_step, b = None, ask_daemon(project, {"op": "snapshot"})["tree"]
    secrets = Secrets(project, args.show_secrets)
    a_name, b_name = f"step {a_step}", "working tree" if b_step is None else f"step {b_step}"
    from ..snapshot.gitview import new_budget
    store = Store(project.state_path("objects"))
    budget = new_budget()        # git's view of every part together: diff answers in seconds
    whole = Part(store, args, secrets, {"from": a_name, "to": b_name, "from_tree": a, "to_tree": b,
                                        "outside": False, "step": None}, budget)
    split = _split(j, a_step, a, b_step, b)
    parts = [whole] if len(split) == 1 else [Part(store, args, secrets, p, budget) for p in split]
    for p in parts:         # a diff too costly to show says the command that shows it
        p.full_command = f"envgit diff {a_step}{'' if b_step is None else f' {b_step}'} --full"
    if args.json:
        out({**whole.to_json(), "parts": [p.to_json() for p in parts]})
        return 0
    if len(parts) == 1:
        _print(whole, f"{a_name} -> {b_name}")
        return 0
    print(f"# {a_name} -> {b_name}: {whole.count()}, in {len(parts)} parts (what was changed "
          "outside envgit apart from what steps changed)")
    for p in parts:
        if p.part["outside"]:
            _print(p, f"outside envgit (step {p.part['step']})")
        else:
            _print(p, f"{p.part['to']} (from {p.part['from']})")
    return 0


def _split(j, a_step, a, b_step, b) -> list[dict]:
    """The range cut where changes were made outside envgit (daemon/outside.py), so those are
    never shown as a step's."""
    from ..daemon.outside import split_range
    return split_range(j, a_step, a, b_step, b)


def _print(p: Part, title: str) -> None:
    """One part as `envgit diff` prints it: its count, git's view, each file and its diff."""
    from ..daemon.snapshots import display
    args = p.args
    print(f"# {inert(title)}: {p.count()}")
    for r in p.repos if not args.raw else ():
        for line in r.lines():
            print(inert(line))
    for c in p.listed:
        if (c.new_type or c.old_type) == "dir" and args.stat:
            continue
        sizes = (f"{c.old_size if c.old_size is not None else '-'} -> "
                 f"{c.new_size if c.new_size is not None else '-'}")
        print(f"{_MARK[c.status]}  {inert(display(c.path))}  ({sizes} bytes)")
        if args.stat:
            continue
        why = p.withheld(c)
        if why:
            print(f"   {withheld_line(why)}")
        else:
            _unified(p.store, p.a, p.b, c, p.work, f"{p.full_command} -- {inert(display(c.path))}")


def _unified(store, a, b, c, work, full_command):
    lines = unified_lines(store, a, b, c, work)
    if isinstance(lines, str) and lines.startswith("too much"):
        print(f"   ({lines}: contents not shown; `{full_command}` shows it)")
    elif isinstance(lines, str):
        print(f"   ({lines}: contents not shown)")
    else:
        sys.stdout.writelines(lines)
