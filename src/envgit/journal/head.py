"""`journal.head`: how far the journal reached, kept outside SQLite (docs/FORMAT.md, "Head
record"), and what a journal that disagrees with it has lost. Standard library only."""

import hashlib
import json
import os
import time

from .errors import Problem

HEAD_FILE = "journal.head"
NEAR = 8        # a head hash this many hex digits or fewer off the row's is a damaged record


def _sum(seq, h, step) -> str:
    """The record's own checksum: a damaged record (disk rot, a slip of an editor) is told
    from one saying the journal's history was rewritten. Unkeyed: it tells damage, not intent."""
    return hashlib.sha256(f"{seq}:{h}:{step}".encode()).hexdigest()[:16]


def near(a, b) -> bool:
    """Two hashes that differ in a few hex digits: one is the other damaged. Two different
    entries' SHA-256 hashes agree in about 4 of 64 digits; agreeing in 56 is not chance."""
    return isinstance(a, str) and isinstance(b, str) and len(a) == len(b) == 64 and \
        0 < sum(x != y for x, y in zip(a, b, strict=True)) <= NEAR


class HeadRecord:
    """`journal.head`: the last entry's seq and hash and the highest step id, rewritten in place
    after every entry, outside SQLite, so that a journal which lost its tail (a
    truncated or deleted WAL, an older copy put back) is seen to have, and step ids go on past
    the lost ones. Unkeyed: whoever can rewrite the journal and recompute its chain can rewrite
    this file too (docs/THREATS.md)."""

    SIZE = 160          # the record is padded to a fixed size and rewritten in place

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None
        self.damaged: str | None = None     # what the last read found wrong with the record

    def write(self, seq: int, h: str, step: int) -> None:
        """One pwrite of a fixed-size record over the old one (~5 µs; a temporary file and a
        rename cost ~300 µs an entry here). A kill cannot tear a pwrite this small; a power
        loss could, and a torn record reads as damaged, which fsck says."""
        rec = json.dumps({"seq": seq, "hash": h, "step": step, "sum": _sum(seq, h, step)},
                         sort_keys=True).encode()
        rec = rec.ljust(self.SIZE - 1) + b"\n"
        try:
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            os.pwrite(self.fd, rec, 0)
        except OSError:
            pass            # best effort: the entry is committed; a stale head only says less

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def read(self, problem=None) -> dict | None:
        """The record, or None if there is none or it is damaged (then `damaged` says how, and
        `problem` is told; after a second look: the writer may have been halfway through
        rewriting it). A record without a checksum is an older envgit's, read as it is."""
        self.damaged = None
        for _ in range(3):
            try:
                with open(self.path) as f:
                    rec = json.loads(f.read())
            except FileNotFoundError:
                return None
            except (OSError, ValueError):
                rec = None
            ok = isinstance(rec, dict) and type(rec.get("seq")) is int and type(rec.get("step")) is int \
                and isinstance(rec.get("hash"), str)
            if ok and "sum" in rec and rec["sum"] != _sum(rec["seq"], rec["hash"], rec["step"]):
                ok, self.damaged = False, "its checksum does not match what it says"
            if ok:
                return rec
            time.sleep(0.02)
        self.damaged = self.damaged or "it cannot be read"
        if problem:
            problem(Problem(f"{HEAD_FILE} is damaged ({self.damaged}): the next envgit command that "
                            "writes rebuilds it from the journal", blocks=False))
        return None


def tail_problem_once(journal) -> dict | None:
    """The body of a `lost` entry if the journal is not what its head record says it reached,
    or if the record itself is damaged; None if all agrees."""
    head = journal.head.read()
    with journal.lock:
        row = journal.db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        at = journal.db.execute("SELECT hash FROM entries WHERE seq = ?",
                                (head["seq"],)).fetchone() if head else None
    last = row[0] if row else 0
    if head is None:
        return head_damaged(last, journal.head.damaged) if journal.head.damaged else None
    if last < head["seq"]:
        return {"entries": [last + 1, head["seq"]], "last_step": head["step"], "head_hash": head["hash"],
                "reason": f"the journal ends at entry {last} but had reached entry {head['seq']} "
                          f"(step {head['step']}): its tail was lost (a truncated or deleted "
                          "journal.sqlite-wal, or an older copy put back)"}
    if at is not None and near(at[0], head["hash"]):
        return head_damaged(last, "its hash is a few digits off entry "
                                  f"{head['seq']}'s, which the chain still holds")
    if at is None or at[0] != head["hash"]:
        return {"entries": [1, head["seq"]], "last_step": head["step"], "head_hash": head["hash"],
                "rewritten": True,
                "reason": f"entry {head['seq']} is not the one the journal had written there: the "
                          "history up to it was rewritten or replaced"}
    return None


def head_damaged(last: int, how: str) -> dict:
    """A `lost` entry saying the head record was damaged, not the history: it is rebuilt from
    the journal as it stands. Only the tail a damaged record would have told of (entries
    lost after `last` before it was damaged) cannot be known."""
    return {"entries": [last + 1, last + 1], "last_step": 0, "head_hash": "", "head_damaged": True,
            "reason": f"{HEAD_FILE} was damaged ({how}) and was rebuilt from the journal, which ends "
                      f"at entry {last}: the head record, not the history, was damaged"}


def recorded_loss(journal, seq, body):
    """A `lost` entry, said by fsck every time. A lost tail leaves what came before it sound
    (rewind goes on trusting it); a rewritten history does not: rewind refuses every target
    up to where it was found. A damaged head record is said, never blocks; nor does a
    "rewritten" an older envgit recorded from a head whose hash was only a few digits off the
    entry the chain holds there (the record was damaged, not the history)."""
    a, b = body.get("entries", [0, 0])
    if body.get("head_damaged"):
        return Problem(f"entry {seq} records that {body.get('reason')}; whether entries after "
                       f"entry {a - 1} were lost before that cannot be told", seq, blocks=False)
    rewritten = bool(body.get("rewritten"))
    if rewritten:
        with journal.lock:
            at = journal.db.execute("SELECT hash FROM entries WHERE seq = ?", (b,)).fetchone()
        if at is not None and near(at[0], body.get("head_hash")):
            return Problem(f"entry {seq} records that entries {a}–{b} were rewritten, but the head record "
                           f"it went by was damaged (its hash a few digits off entry {b}'s, which "
                           "the chain holds): the history was not rewritten", seq, blocks=False)
    return Problem(f"entry {seq} records that {body.get('reason', 'entries were lost')}; entries "
                   f"{a}–{b} as they were are gone, and what steps up to {body.get('last_step')} did "
                   "after their last recorded entry is not known",
                   1 if rewritten else seq, blocks=rewritten, until=b)
