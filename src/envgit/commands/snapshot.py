"""ls, cat, restore: what a step's snapshot holds, read without touching the project.

The verbs restic and git users reach for (`restic ls`/`git ls-tree`, `restic dump`/`git show
N:PATH`, `restic restore --target`): they read the store directly (readers need no daemon: the
store's packs are sealed before a step's entry names its tree) and never write the project.

Also here, shared with diff: which step's tree a reference names (`step_tree`); which paths'
contents are withheld because the policy denies them is view/secrets.py's `Secrets`.
"""

import os
import stat
import sys
from typing import cast

from ..inert import inert, inert_line
from ..paths import find_project
from ..view.secrets import Secrets
from . import STEP_HELP, Usage, command, json_flag, open_journal, out, progress, resolve_step, step_ref
from .restoreplan import plan as restore_plan
from .restoreplan import restore_target

EXAMPLES = {
    "ls": ["envgit ls last", "envgit ls last~1 src/ -r --json"],
    "cat": ["envgit cat last~1:src/app.py", "envgit cat 12:.env --show-secrets"],
    "restore": ["envgit restore 12 --target /tmp/at-12", "envgit restore last~1 --target ../old -- src/"],
}


def add_parsers(sub, argparse):
    s = command(sub, "ls", help="list what the snapshot of a step holds: names, types, modes, sizes",
                example=EXAMPLES["ls"], usage="envgit ls STEP [PATH] [-r] [--json]",
                description=para("List a directory (or one file) of the snapshot taken after a step, like "
                "`git ls-tree` or `restic ls`: mode, size and path; a symlink with its target."))
    s.add_argument("step", type=step_ref, help=STEP_HELP)
    s.add_argument("path", nargs="?", default="", help="a directory or file in it (default: the top)")
    s.add_argument("-r", "--recursive", action="store_true", help="everything under PATH, not one level")
    json_flag(s)
    s.set_defaults(fn=cmd_ls)

    s = command(sub, "cat", help="print a file as it was in the snapshot of a step",
                example=EXAMPLES["cat"], usage="envgit cat STEP:PATH [--show-secrets]",
                description=para("Print a file of the snapshot taken after a step, like `git show REV:PATH`: "
                "its bytes as they are when piped; on a terminal, control characters shown as escapes "
                "(\\x1b). A symlink prints its target. A file the policy denies to steps (a .env) is "
                "withheld (exit 1) unless --show-secrets."))
    s.add_argument("spec", metavar="STEP:PATH", help="a step (N, last, last~K), a colon, a path in the project")
    s.add_argument("--show-secrets", action="store_true",
                   help="print a file the policy denies to steps (deny_read) too")
    s.set_defaults(fn=cmd_cat)

    s = command(sub, "restore", help="write the snapshot of a step (or some paths of it) into another "
                "directory; the project is not touched", example=EXAMPLES["restore"],
                usage="envgit restore STEP --target DIR [--force] [--json] [-- PATH…]",
                description=para("Write the snapshot taken after a step, or the PATHs of it, into DIR, like "
                "`restic restore --target`: files, modes and symlinks byte for byte (setuid/setgid bits "
                "never: docs/FORMAT.md). DIR must be outside the project and new or empty unless "
                "--force; nothing is written through a symlink, so nothing lands outside DIR. "
                "`envgit rewind` is what brings the project itself back."))
    s.add_argument("step", type=step_ref, help=STEP_HELP)
    s.add_argument("--target", required=True, metavar="DIR", help="where to write (created if missing)")
    s.add_argument("--from", dest="remote_from", metavar="NAME", help="fetch the step's tree from a "
                   "remote's bucket (another machine's too: --project, --machine); no project needed")
    s.add_argument("--project", metavar="NAME", help="with --from: which project (default: this one's name)")
    s.add_argument("--machine", metavar="NAME", help="with --from: which machine (default: this one, or the only one)")
    s.add_argument("--force", action="store_true",
                   help="write into a non-empty directory: what the snapshot has replaces what is there "
                        "(nothing else is deleted; a directory where the snapshot has a file is refused)")
    json_flag(s)
    s.set_defaults(paths=[], fn=cmd_restore)


def para(text: str) -> str:
    """A command's description, wrapped (its parser keeps the example's lines as written)."""
    import textwrap
    return textwrap.fill(text, 88)


# --- shared with diff ---------------------------------------------------------------------

def step_tree(j, ref) -> tuple[int, str]:
    """(step number, root tree id) of the snapshot after the step a reference names."""
    n = resolve_step(j, ref)
    s = j.step(n) if j else None
    if s is None:
        raise Usage(f"no step {n}; `envgit log` lists them")
    if n in j.dropped_snapshots():
        raise Usage(f"the snapshot of step {n} was dropped by `envgit gc`; pick a later step")
    if not s.snapshot or not s.snapshot.get("tree"):
        raise Usage(f"step {n} has no snapshot ({s.status}); pick another step")
    return n, s.snapshot["tree"]


def withheld_line(reason: str) -> str:
    return f"(denied by the policy, {reason}: content withheld; --show-secrets shows it)"


# --- ls ------------------------------------------------------------------------------------

_KIND = {"file": "-", "exec": "-", "dir": "d", "symlink": "l"}
_TYPE_BITS = {"file": stat.S_IFREG, "exec": stat.S_IFREG, "dir": stat.S_IFDIR, "symlink": stat.S_IFLNK}


def cmd_ls(args):
    from ..daemon.snapshots import display
    from ..snapshot import Store
    project = find_project()
    j = open_journal(project)
    n, tree = step_tree(j, args.step)
    store = Store(project.state_path("objects"))
    rows = _listing(store, tree, _rel_path(args.path), args.recursive)
    if args.json:
        out({"step": n, "tree": tree, "path": args.path.strip("/"), "recursive": args.recursive,
             "entries": [{"path": display(p), "type": e_type, "mode": f"{mode:04o}", "size": size,
                          "target": display(target) if target is not None else None, "id": oid}
                         for p, e_type, mode, size, target, oid in rows]})
        return 0
    for p, e_type, mode, size, target, _oid in rows:
        shown = inert(display(p)) + ("/" if e_type == "dir" else "")
        if e_type == "symlink":
            shown += " -> " + inert(display(target))
        size_text = "-" if e_type == "dir" else str(size)
        print(f"{stat.filemode(_TYPE_BITS[e_type] | mode)}  {size_text:>10}  {shown}")
    return 0


def _listing(store, tree: str, path: bytes, recursive: bool) -> list[tuple]:
    """[(path, type, mode, size, symlink target, content id)] of PATH (a file: itself; a
    directory: its entries, or everything under it)."""
    from ..snapshot.diff import read_tree
    from ..snapshot.encoding import DIR, TYPE_NAMES
    objects = store.objects
    entries = read_tree(objects, bytes.fromhex(tree))
    if path:
        parts = path.split(b"/")
        for i, name in enumerate(parts):
            e = next((x for x in entries if x.name == name), None)
            if e is None or (i < len(parts) - 1 and e.type != DIR):
                raise Usage(f"{os.fsdecode(path)}: not in this snapshot; `envgit ls STEP` lists its top")
            if e.type != DIR:
                return [_row(path, e, TYPE_NAMES)]
            entries = read_tree(objects, cast(bytes, e.oid))     # (a directory's entry has its id)
    rows = []
    # Depth-first with an explicit stack (a step chooses how deep the tree is: no recursion).
    stack = [(path + b"/" if path else b"", iter(entries))]
    while stack:
        prefix, it = stack[-1]
        e = next(it, None)
        if e is None:
            stack.pop()
            continue
        p = prefix + e.name
        rows.append(_row(p, e, TYPE_NAMES))
        if recursive and e.type == DIR:
            stack.append((p + b"/", iter(read_tree(objects, cast(bytes, e.oid)))))   # (as above)
    return rows


def _row(path, e, names):
    return (path, names[e.type], e.mode, e.size if names[e.type] != "dir" else 0, e.target,
            e.oid.hex() if e.oid else None)


def _rel_path(text: str) -> bytes:
    """A project-relative path as the store names it: no leading ./ or /, no trailing /."""
    p = os.path.normpath(text.strip()) if text.strip() else ""
    if p in (".", ""):
        return b""
    if p.startswith("/") or p == ".." or p.startswith("../"):
        raise Usage(f"{text}: give a path relative to the project's top (as `envgit ls STEP` shows them)")
    return os.fsencode(p)


# --- cat -----------------------------------------------------------------------------------

def cmd_cat(args):
    from ..snapshot import Store
    project = find_project()
    ref, colon, path_text = args.spec.partition(":")
    if not colon or not path_text:
        raise Usage(f"{args.spec!r}: give STEP:PATH, e.g. `{EXAMPLES['cat'][0]}`")
    import argparse
    try:
        ref = step_ref(ref)
    except argparse.ArgumentTypeError as e:
        raise Usage(str(e)) from None
    path = _rel_path(path_text)
    if not path:
        raise Usage(f"{args.spec!r}: the top of the project is a directory; `envgit ls {ref}` lists it")
    j = open_journal(project)
    n, tree = step_tree(j, ref)
    store = Store(project.state_path("objects"))
    try:
        data = store.read_file(tree, path)
    except FileNotFoundError:
        raise Usage(f"{path_text}: not in the snapshot of step {n}; `envgit ls {n}` lists it") from None
    except IsADirectoryError:
        raise Usage(f"{path_text}: a directory in the snapshot of step {n}; `envgit ls {n} {path_text}` "
                    "lists it") from None
    why = Secrets(project, args.show_secrets).reason(path, (data,))
    if why:
        raise Usage(f"{path_text} {withheld_line(why)}", 1)
    if sys.stdout.isatty():
        # what a step wrote, on the person's terminal: inert (escapes shown, not obeyed)
        text = data.decode("utf-8", "backslashreplace")
        sys.stdout.writelines(inert_line(line) for line in text.splitlines(keepends=True))
        sys.stdout.flush()
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


# --- restore -------------------------------------------------------------------------------

def cmd_restore(args):
    if args.remote_from is not None:
        from .remote import restore_from
        return restore_from(args)
    from ..snapshot import Store
    project = find_project()
    j = open_journal(project)
    n, tree = step_tree(j, args.step)
    target = restore_target(project, args.target, args.force)
    store = Store(project.state_path("objects"))
    plan = restore_plan(store, tree, target, [_rel_path(p) for p in args.paths], args.force, n)
    from ..snapshot.restore import apply_plan
    created = not os.path.lexists(target)
    os.makedirs(target, exist_ok=True)
    try:
        with progress(len(plan.write) + len(plan.delete), "path", "restore") as bar:
            apply_plan(store.objects, target, plan, lambda done, total: bar.update(done - bar.n),
                       partial=True)     # the other paths still come back; the damaged named
    except BaseException:
        if created:             # refused before the first write (a damaged store): leave nothing
            try:
                os.rmdir(target)
            except OSError:
                pass
        raise
    counts = {k: sum(1 for i in plan.write if i.type in kinds)
              for k, kinds in (("files", ("file", "exec")), ("dirs", ("dir",)), ("symlinks", ("symlink",)))}
    size = sum(i.size for i in plan.write if i.type in ("file", "exec"))
    if args.json:
        out({"step": n, "tree": tree, "target": target, "paths": args.paths, **counts, "bytes": size,
             "replaced": len(plan.delete)})
        return 0
    print(f"restored step {n} (tree {tree[:12]}) into {inert(target)}: {counts['files']} file(s), "
          f"{counts['dirs']} director(ies), {counts['symlinks']} symlink(s), {size} bytes")
    return 0


