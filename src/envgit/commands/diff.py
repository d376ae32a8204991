"""diff: what changed between two steps, or a step and the working tree."""

import sys

from ..inert import inert, inert_line
from ..paths import find_project
from . import Usage, ask_daemon, open_journal, out


def add_parsers(sub, argparse):
    s = sub.add_parser("diff", help="what changed between two steps, or a step and the working tree",
                       usage="envgit diff [A] [B] [--stat] [--json] [-- PATH…]")
    s.add_argument("a", nargs="?", type=int, help="a step (default: the last one)")
    s.add_argument("b", nargs="?", type=int, help="a later step (default: the working tree)")
    s.add_argument("--stat", action="store_true", help="names and sizes only")
    s.set_defaults(paths=[], fn=cmd_diff)
    s.add_argument("--json", action="store_true")


# --- diff --------------------------------------------------------------------------------

def _step_tree(j, n):
    s = j.step(n) if j else None
    if s is None:
        raise Usage(f"no step {n}; `envgit log` lists them")
    if not s.snapshot or not s.snapshot.get("tree"):
        raise Usage(f"step {n} has no snapshot")
    return s.snapshot["tree"]


def cmd_diff(args):
    from ..daemon.snapshots import display
    from ..snapshot import Store
    project = find_project()
    j = open_journal(project)
    try:
        latest = j.last_snapshot_step() if j and args.a is None else None
        if args.a is None and latest is None:
            raise Usage("no snapshots yet: envgit run -- CMD takes one after every step")
        a_name = f"step {args.a}" if args.a is not None else f"step {latest.id}"
        a = _step_tree(j, args.a) if args.a is not None else latest.snapshot["tree"]
        if args.b is not None:
            b, b_name = _step_tree(j, args.b), f"step {args.b}"
        else:
            b, b_name = ask_daemon(project, {"op": "snapshot"})["tree"], "working tree"
    except Usage as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    store = Store(project.state_path("objects"))
    changes = store.diff(a, b)
    if args.paths:
        want = [p.rstrip("/") for p in args.paths]
        changes = [c for c in changes if any(display(c.path) == w or display(c.path).startswith(w + "/")
                                             for w in want)]
    if args.json:
        out({"from": a_name, "to": b_name, "from_tree": a, "to_tree": b, "changes": [
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
    from ..daemon.snapshots import display
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
