"""Changes made outside envgit (the person's editor, their own `git commit`, a file copied in)
between two steps: recorded as a step of their own, one `outside` entry, before the next step
or rewind begins, so they are never charged to the step after them and a rewind's undo point
holds them.

How it is seen: the directory is snapshotted against the last tree the daemon knows (the newest
snapshot in time, steporder.py: with steps run at once that is not the highest step's). While
the daemon runs, the resident stat cache and inotify watcher make that a look at the
directories that had events (well under a millisecond when nothing changed); a daemon just
started walks the directory once with the stat cache read from disk, which the step's own
snapshot would otherwise have done after it. Nothing is checked while another step runs: a
change then cannot be told from that step's own (an agent's session step, a long `envgit run`).
"""

import os

from .. import steporder
from . import special_bits
from .snapshots import SnapshotFailed


def record(sess, pol, before: str) -> int | None:
    """Snapshot the project; if it differs from the last tree, record the difference as an
    `outside` step and make its tree the last one. Returns that step's id, or None when nothing
    changed. Call with the session's tree lock held and no step running."""
    if sess.last_tree is None:
        return None                     # no tree yet: the first step's baseline covers it
    try:
        summary = sess.snapshotter.take(pol, sess.last_tree)
    except (SnapshotFailed, OSError) as e:     # the step goes on; its own snapshot says more
        print(f"envgit daemon: changes made outside envgit could not be looked for: {e}", flush=True)
        return None
    if summary["tree"] == sess.last_tree:
        return None
    return write(sess, summary, before)


def write(sess, summary, before: str) -> int:
    """The `outside` step for a snapshot already taken (its summary against sess.last_tree)."""
    last = steporder.newest_tree(sess.journal)     # newest in time: steps run at once
    since = last.step if last is not None and last.tree == sess.last_tree else None
    body = {"snapshot": summary, "session": sess.id, "user": _me(), "since_step": since, "before": before}
    alive = sandboxes_holding(sess.project.root)
    if alive:           # a sandbox outlived its step (the MCP REPL): not only the person could write
        body["sandboxes_alive"] = alive
    # No setuid/setgid bit stays in the project, however it got there (special_bits.py): one
    # that appeared between steps is stripped here, where it is first seen, and said after the
    # step that follows (it used to be that step's change, stripped at its end).
    stripped = special_bits.strip(sess.project.root, summary)
    if stripped:
        body["setuid_stripped"] = stripped
        sess.outside_notices.append(
            "setuid-stripped: a setuid or setgid bit on files changed outside envgit (outside step "
            "{step}) was removed (a program anyone could run as their owner): " + ", ".join(stripped))
    step = sess.journal.outside_step(body)
    if stripped:
        sess.outside_notices[-1] = sess.outside_notices[-1].replace("{step}", str(step))
    sess.last_tree, sess.tree_unknown = summary["tree"], False
    return step


def sandboxes_holding(root: str) -> int:
    """How many processes of another mount namespace (a sandbox: bwrap makes one) have the
    project mounted, i.e. could have written it between steps. A long-lived sandboxed helper
    (the MCP REPL, kept across `execute` calls) is alive between steps; a timer in it could
    write then, and its change must not pass for the person's. Read only when a difference
    was found (a /proc walk: ~1-2 ms)."""
    try:
        mine = os.readlink("/proc/self/ns/mnt")
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return 0
    n = 0
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/ns/mnt") == mine:
                continue
            with open(f"/proc/{pid}/mountinfo", "rb") as f:
                points = [_unescape(line.split(b" ", 5)[4]) for line in f]
        except (OSError, IndexError):
            continue                    # gone, or not ours to read
        if any(p == root or p.startswith(root.rstrip("/") + "/") for p in points):
            n += 1
    return n


def _unescape(field: bytes) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for esc, ch in ((b"\\040", b" "), (b"\\011", b"\t"), (b"\\012", b"\n"), (b"\\134", b"\\")):
        field = field.replace(esc, ch)
    return field.decode("utf-8", "surrogateescape")


def _me() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def split_range(journal, a_step: int, a_tree: str, b_step: int | None, b_tree: str) -> list[dict]:
    """`envgit diff A B` cut where changes were made outside envgit, so that those are never
    shown as a step's: [{"from", "to" (names), "from_tree", "to_tree", "outside" (bool),
    "step" (the outside step, or None)}], in order, each with a different pair of trees.
    One part (the whole range) when no outside step lies in (A, B]; B None is the working
    tree."""
    ids = journal.outside_ids(a_step, b_step) if journal is not None else []
    if not ids:
        return [_part(f"step {a_step}", _name(b_step), a_tree, b_tree, None)]
    folded = {s.id: s for s in journal.steps_between(a_step, ids[-1])}
    parts, cur, cur_name = [], a_tree, f"step {a_step}"
    for o in ids:
        before = a_tree, f"step {a_step}"       # the last tree in [A, o): what o was compared with
        for n in range(o - 1, a_step, -1):
            tree = ((folded.get(n) and folded[n].snapshot) or {}).get("tree")
            if tree:
                before = tree, f"step {n}"
                break
        after = ((folded.get(o) and folded[o].snapshot) or {}).get("tree")
        if after is None:
            continue
        if before[0] != cur:
            parts.append(_part(cur_name, before[1], cur, before[0], None))
        parts.append(_part(before[1], f"step {o}", before[0], after, o))
        cur, cur_name = after, f"step {o}"
    if b_tree != cur:
        parts.append(_part(cur_name, _name(b_step), cur, b_tree, None))
    return parts or [_part(f"step {a_step}", _name(b_step), a_tree, b_tree, None)]


def _name(step):
    return "working tree" if step is None else f"step {step}"


def _part(a_name, b_name, a_tree, b_tree, outside_step):
    return {"from": a_name, "to": b_name, "from_tree": a_tree, "to_tree": b_tree,
            "outside": outside_step is not None, "step": outside_step}
