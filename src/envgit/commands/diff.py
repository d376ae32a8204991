"""diff: what changed between two steps, or a step and the working tree.

A repository's `.git` is shown as git sees it (refs moved, commits added and lost, index
changed: snapshot/gitview.py), not as the object files behind it, which `--raw` lists. A path
the policy denies (a `.env`) is listed as changed with its content withheld, unless
`--show-secrets`.
"""

import math
import sys

from ..inert import inert, inert_line
from ..paths import find_project
from . import STEP_HELP, Usage, ask_daemon, command, json_flag, open_journal, out, step_ref
from .snapshot import Secrets, para, step_tree, withheld_line


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
    whole = _Part(store, args, secrets, {"from": a_name, "to": b_name, "from_tree": a, "to_tree": b,
                                         "outside": False, "step": None}, budget)
    split = _split(j, a_step, a, b_step, b)
    parts = [whole] if len(split) == 1 else [_Part(store, args, secrets, p, budget) for p in split]
    for p in parts:         # a diff too costly to show says the command that shows it
        p.full_command = f"envgit diff {a_step}{'' if b_step is None else f' {b_step}'} --full"
    if args.json:
        out({**whole.to_json(), "parts": [p.to_json() for p in parts]})
        return 0
    if len(parts) == 1:
        whole.print(f"{a_name} -> {b_name}")
        return 0
    print(f"# {a_name} -> {b_name}: {whole.count()}, in {len(parts)} parts (what was changed "
          "outside envgit apart from what steps changed)")
    for p in parts:
        if p.part["outside"]:
            p.print(f"outside envgit (step {p.part['step']})")
        else:
            p.print(f"{p.part['to']} (from {p.part['from']})")
    return 0


def _split(j, a_step, a, b_step, b) -> list[dict]:
    """The range cut where changes were made outside envgit (daemon/outside.py), so those are
    never shown as a step's."""
    from ..daemon.outside import split_range
    return split_range(j, a_step, a, b_step, b)


class _Part:
    """The changes from one tree to another, as diff shows them: a repository's `.git` as
    git's view unless --raw, the paths asked for, denied contents withheld."""

    def __init__(self, store, args, secrets, part: dict, budget=None):
        from ..daemon.snapshots import display
        from ..snapshot.gitview import covered, git_changes
        self.store, self.args, self.secrets, self.part = store, args, secrets, part
        self.work = new_work(getattr(args, "full", False))   # the diff text's budget (DIFF_WORK_TOTAL)
        self.full_command = "envgit diff --full"        # what shows a file's diff unbounded
        self.a, self.b = part["from_tree"], part["to_tree"]
        changes = store.diff(self.a, self.b)
        repos = git_changes(store, self.a, self.b, changes, budget)
        if args.paths:
            want = [p.rstrip("/") for p in args.paths]
            changes = [c for c in changes if any(display(c.path) == w or display(c.path).startswith(w + "/")
                                                 for w in want)]
            repos = [r for r in repos if any(r.gitdir == w or r.gitdir.startswith(w + "/")
                                             or w.startswith(r.gitdir + "/") or not w for w in want)]
        self.repos = repos
        self.listed = changes if args.raw else [c for c in changes if not covered(repos, c.path)]

    def withheld(self, c):
        return self.secrets.reason(c.path, lambda: _both(self.store, self.a, self.b, c))

    def to_json(self) -> dict:
        from ..daemon.snapshots import display
        return {**self.part, "raw": self.args.raw, "git": [r.to_json() for r in self.repos],
                "changes": [{"path": display(c.path), "status": c.status, "old_size": c.old_size,
                             "new_size": c.new_size, "old_type": c.old_type, "new_type": c.new_type,
                             "withheld": self.withheld(c) is not None}
                            for c in self.listed]}

    def count(self) -> str:
        files = sum(1 for c in self.listed if (c.new_type or c.old_type) != "dir")
        under_git = sum(r.files for r in self.repos) if not self.args.raw else 0
        return f"{files} file(s) changed" + (
            f", and {under_git} under .git/ that git's view below stands for" if under_git else "")

    def print(self, title: str) -> None:
        from ..daemon.snapshots import display
        args = self.args
        print(f"# {inert(title)}: {self.count()}")
        for r in self.repos if not args.raw else ():
            for line in r.lines():
                print(inert(line))
        for c in self.listed:
            if (c.new_type or c.old_type) == "dir" and args.stat:
                continue
            sizes = (f"{c.old_size if c.old_size is not None else '-'} -> "
                     f"{c.new_size if c.new_size is not None else '-'}")
            print(f"{_MARK[c.status]}  {inert(display(c.path))}  ({sizes} bytes)")
            if args.stat:
                continue
            why = self.withheld(c)
            if why:
                print(f"   {withheld_line(why)}")
            else:
                _unified(self.store, self.a, self.b, c, self.work,
                         f"{self.full_command} -- {inert(display(c.path))}")


def _is_file(t):
    return t in ("file", "exec")


def _both(store, a, b, c) -> tuple:
    """The two versions of a changed file (None where it is not a file)."""
    return (store.read_file(a, c.path) if _is_file(c.old_type) else None,
            store.read_file(b, c.path) if _is_file(c.new_type) else None)


def _unified(store, a, b, c, work, full_command):
    lines = unified_lines(store, a, b, c, work)
    if isinstance(lines, str) and lines.startswith("too much"):
        print(f"   ({lines}: contents not shown; `{full_command}` shows it)")
    elif isinstance(lines, str):
        print(f"   ({lines}: contents not shown)")
    else:
        sys.stdout.writelines(lines)


# difflib's matcher is quadratic in the lines that differ when they repeat (a step can write
# 230,000 short lines of 2,500 values: minutes of CPU per view). A file's changed middle (its
# common head and tail cut off) is diffed only while its lines one side times the other stay
# under DIFF_WORK (20,000 x 20,000: ~0.3 s here), and one command or page spends at most
# DIFF_WORK_TOTAL on all its files; past either, the file is listed without its text.
DIFF_WORK = 400_000_000
DIFF_WORK_TOTAL = 1_200_000_000


def new_work(full: bool = False) -> list[float]:
    """The diff-text budget of one command or page, shared by its files: [what is left of
    DIFF_WORK_TOTAL, a file's limit DIFF_WORK]; full (`envgit diff --full`): no limit."""
    return [math.inf, math.inf] if full else [DIFF_WORK_TOTAL, DIFF_WORK]


def unified_lines(store, a, b, c, work=None) -> list[str] | str:
    """A changed file's unified diff as inert lines ([] when neither side is a file), or why
    it is not shown: binary or over 1 MiB a side, or too much changed to diff within the
    bounds above (diff and `envgit ui` show the same thing). `work`: new_work()'s budget."""
    import difflib

    from ..daemon.snapshots import display
    if not (_is_file(c.old_type) or _is_file(c.new_type)):
        return []

    def text(tree, present):
        if not present:
            return []
        data = store.read_file(tree, c.path)
        if b"\0" in data[:8192] or len(data) > 1 << 20:
            raise ValueError
        return data.decode("utf-8").splitlines(keepends=True)
    try:
        old = text(a, _is_file(c.old_type))
        new = text(b, _is_file(c.new_type))
    except (ValueError, UnicodeDecodeError):
        return "binary or large"
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    cost = (len(old) - head - tail) * (len(new) - head - tail)
    work = work if work is not None else new_work()
    if cost > work[1] or cost > work[0]:
        return (f"too much changed to diff here: {len(old) - head - tail} lines -> "
                f"{len(new) - head - tail} lines")
    work[0] -= cost
    # only the changed middle and its context go to difflib; hunk lines are shifted back
    lo, keep = max(head - 3, 0), max(tail - 3, 0)
    name = inert(display(c.path))
    out = []
    for line in difflib.unified_diff(old[lo:len(old) - keep], new[lo:len(new) - keep], f"a/{name}", f"b/{name}"):
        if lo and line.startswith("@@ "):
            line = _shift_hunk(line, lo)
        out.append(inert_line(line))
    return out


def _shift_hunk(line: str, by: int) -> str:
    """`@@ -3,4 +3,5 @@` of a diff of lines from `by` on, as the whole file's line numbers."""
    _, old, new, rest = line.split(" ", 3)

    def shift(r):
        start, _, length = r[1:].partition(",")
        return f"{r[0]}{int(start) + by}" + (f",{length}" if length else "")
    return f"@@ {shift(old)} {shift(new)} {rest}"
