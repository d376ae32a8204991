"""Which step is the newest: steps in the order their snapshots were taken, not by number.

Step numbers follow the starts; steps run at once (an agent's parallel tool calls, several
`envgit run` in one project), so the highest number may be a step that started last and ended
first, whose snapshot lacks what the others wrote after it. Every name that means "newest"
(`last`, `last~K`, the tree a daemon compares the directory with when it starts) follows this
order instead:

- a step with a snapshot ranks by when its snapshot was taken: the summary's `taken_at`
  (daemon/snapshots.py stamps it under the snapshot lock, so these are in the order the trees
  were made), else, in a journal written before it was stamped, the time of the entry that
  carries it (`end`, `interrupted`, `outside`);
- an ended step without one (refused, its snapshot failed) by the time of its closing entry;
- a step still running by the time of its `begin` (it has changed nothing on record yet).

A snapshot is always taken before the entry that carries it is written, so every step whose
entries all lie before a point in the journal ranks at or below that point's time: the newest
are found by reading the journal's tail, a bigger tail only when the order is not settled yet
(what `last` costs does not grow with the journal). Standard library only.
"""

import json
from dataclasses import dataclass

_KINDS = ("begin", "end", "interrupted", "outside")
_FIRST_WINDOW = 64


@dataclass
class Ranked:
    step: int
    key: int                    # ns: when its snapshot was taken, it ended, or it began
    tree: str | None = None     # its snapshot's tree, if it has one
    ran: bool = True            # False for a step a shell rule refused (it ran nothing)
    running: bool = False


def newest_first(journal):
    """Yield Ranked steps, newest first (see the module's docstring)."""
    done: set[int] = set()
    window = _FIRST_WINDOW
    while True:
        with journal.lock:
            top = journal.db.execute("SELECT MAX(seq) FROM entries").fetchone()[0] or 0
            lo = max(0, top - window)
            rows = journal.db.execute(
                f"SELECT seq, step, kind, at_ns, body FROM entries WHERE seq > ? AND kind IN "
                f"({','.join('?' * len(_KINDS))}) ORDER BY seq", (lo, *_KINDS)).fetchall()
        ranked: dict[int, Ranked] = {}
        times = []
        for _seq, step, kind, at, text in rows:
            if type(step) is not int or type(at) is not int or step < 1:
                continue                # a row edited out of shape: `envgit fsck` names it
            times.append(at)
            _rank(ranked, step, kind, at, text)
        # Every step not in this tail ranks at or below the tail's oldest time.
        bound = min(times) if lo > 0 and times else None
        for r in sorted(ranked.values(), key=lambda r: (r.key, r.step), reverse=True):
            if bound is not None and r.key < bound:
                break
            if r.step not in done:
                done.add(r.step)
                yield r
        if lo == 0:
            return
        window *= 4


def ranked(rows) -> list[Ranked]:
    """Every step of whole-journal `rows` ((seq, step, kind, at_ns, body, …), a remote
    machine's journal as read.MachineView holds it), newest first."""
    out: dict[int, Ranked] = {}
    for row in rows:
        _seq, step, kind, at, text = row[:5]
        if kind in _KINDS and type(step) is int and type(at) is int and step >= 1:
            _rank(out, step, kind, at, text)
    return sorted(out.values(), key=lambda r: (r.key, r.step), reverse=True)


def _rank(ranked, step, kind, at, text):
    try:
        body = json.loads(text)
    except (TypeError, ValueError):
        return
    if not isinstance(body, dict):
        return
    if kind == "begin":
        ranked[step] = Ranked(step, at, ran="refused" not in (body.get("marks") or []), running=True)
        return
    r = ranked.setdefault(step, Ranked(step, at))
    snap = body.get("snapshot")
    tree = snap.get("tree") if isinstance(snap, dict) else None
    taken = snap.get("taken_at") if isinstance(snap, dict) else None
    r.running = False
    r.tree = tree if isinstance(tree, str) else None
    r.key = taken if r.tree and type(taken) is int else at
    if "refused" in (body.get("marks") or []):
        r.ran = False


def newest_tree(journal) -> Ranked | None:
    """The step whose snapshot is the newest tree (what the directory was last seen as)."""
    for r in newest_first(journal):
        if r.tree:
            return r
    return None


def newest_untreed(journal) -> bool:
    """Whether the newest step that ran something has no snapshot (it failed, it was killed
    before one, or it is still open: a daemon that died left it): what the directory holds
    beyond the newest tree may be its."""
    for r in newest_first(journal):
        if r.ran:
            return not r.tree
    return False
