"""A step's diff as envgit shows it (`envgit diff`, the page's step view): the changes from one
tree to another with a repository's `.git` as git sees it (snapshot/gitview.py), and a changed
file's unified diff within bounds that keep a view quick."""

import math

from ..inert import inert, inert_line


class Part:
    """The changes from one tree to another, as diff shows them: a repository's `.git` as
    git's view unless --raw, the paths asked for, denied contents withheld. `envgit diff`
    prints it (commands/diff.py), the page shows it (ui/stepview.py)."""

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


def _is_file(t):
    return t in ("file", "exec")


def _both(store, a, b, c) -> tuple:
    """The two versions of a changed file (None where it is not a file)."""
    return (store.read_file(a, c.path) if _is_file(c.old_type) else None,
            store.read_file(b, c.path) if _is_file(c.new_type) else None)


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
