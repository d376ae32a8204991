"""The writer's check that the journal's tail is still what it last wrote (issue 32): rows
deleted or replaced while the daemon runs are recorded as a `lost` entry, never chained over
silently. The check costs nothing on the hot path: `_append` already reads the newest row to
chain onto it, and compares that with the (seq, hash) it holds. Standard library only."""

import time

from .chain import GENESIS, entry_hash
from .rows import check_entry


def tail_moved(journal, row):
    """Called inside the append's transaction when the newest row is not `journal.tip` (what
    this writer last wrote or found on opening). Records what changed as the journal's next
    entries (a `lost` entry, and `interrupted` for steps whose end went with it) and returns
    the row the caller chains onto."""
    db = journal.db
    seq0, h0 = journal.tip or (0, "")
    last = row[0] if row else 0
    if last > seq0:     # rows past ours: sound only if ours is still where we left it
        at = db.execute("SELECT hash FROM entries WHERE seq = ?", (seq0,)).fetchone()
        if at is not None and at[0] == h0:
            return row
    if last < seq0:
        what = f"entries {last + 1}–{seq0}, written while the session daemon ran, were" \
            if seq0 > last + 1 else f"entry {seq0}, written while the session daemon ran, was"
        body = {"entries": [last + 1, seq0], "last_step": journal.floor, "head_hash": h0,
                "reason": f"{what} "
                          "deleted from the journal under it (found before the next entry was "
                          "chained onto what was left)"}
    else:
        body = {"entries": [1, max(last, seq0)], "last_step": journal.floor, "head_hash": h0,
                "rewritten": True,
                "reason": f"entry {seq0} is not the one the session daemon had written there: the "
                          "journal was rewritten or replaced under it"}
    open_before = {r[0] for r in db.execute("SELECT step FROM open_steps")}
    row = _insert(journal, row, 0, "lost", body)
    journal._fill_open_steps()
    for n in sorted(journal._open_by_fold() - open_before):    # their ends were among the lost
        row = _insert(journal, row, n, "interrupted", {
            "reason": "the journal lost its later entries (see `envgit fsck`): whether this step "
                      "finished, and how, is not known"})
    journal._fill_open_steps()
    journal.tip = row
    return row


def _insert(journal, row, step, kind, body):
    seq, prev = (row[0] + 1, row[1]) if row else (1, GENESIS)
    text, at = check_entry(step, kind, body), time.time_ns()
    h = entry_hash(seq, step, kind, at, text, prev)
    journal.db.execute("INSERT INTO entries VALUES (?,?,?,?,?,?,?)", (seq, step, kind, at, text, prev, h))
    return (seq, h)
