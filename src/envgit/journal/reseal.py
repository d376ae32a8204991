"""Re-sealing a journal whose chain does not verify (`envgit fsck --repair`; docs/FORMAT.md,
"Re-sealing").

A row changed, deleted or renumbered after it was written breaks the chain at that row, and
rewind refuses every target after it, forever. A re-seal sets the rows that do not verify aside
(moved, byte for byte, into the `set_aside` table, never dropped) and appends one `reseal`
entry (step 0) that names them and re-joins the chain past them: for each place where a kept
entry does not follow the kept entry before it, a link {seq, prev, after, after_hash}. A
verifier accepts that break only when such a link names it and every seq between is one the
same `reseal` entry set aside or found missing. Steps whose closing entry went aside are closed
as `interrupted` in the same transaction (else the daemon would re-finish a rewind, or say the
step's run died).

Which rows go aside (the repairer's rule; a verifier only checks the links): a row whose hash
does not recompute, whose step or time is not a number, or whose body does not read as its
kind; and a row the next entry disowns (it names another hash as `prev`: one of the two was
rewritten with its hash recomputed, and the next one's own hash covers its `prev`). A row whose
next entry is missing is kept: it verifies by itself, and setting it aside would take an
innocent step's end with it. Standard library only.
"""

import time

from .. import faults
from .chain import CLOSING, GENESIS, entry_hash
from .errors import Problem
from .fold import fold_entry
from .rows import check_entry, read_body

SET_ASIDE_SCHEMA = """
CREATE TABLE IF NOT EXISTS set_aside (
    seq INTEGER PRIMARY KEY, step, kind, at_ns, body, prev, hash,
    reseal INTEGER NOT NULL,       -- the `reseal` entry that set it aside
    why    TEXT NOT NULL
)"""
COLUMNS = "seq, step, kind, at_ns, body, prev, hash"


class Seals:
    """The `reseal` entries of a journal whose own hash recomputes and whose body reads."""

    def __init__(self, journal):
        with journal.lock:
            found = journal.db.execute(f"SELECT {COLUMNS} FROM entries WHERE step = 0 AND kind = 'reseal' "
                                       "ORDER BY seq").fetchall()
        self.bodies: dict[int, dict] = {}
        for seq, step, kind, at, text, p, h in found:
            body, wrong = read_body(kind, text)
            if body is not None and not wrong and _hash_ok(seq, step, kind, at, text, p, h):
                self.bodies[seq] = body
        self.covered = {s for b in self.bodies.values() for s in b.get("set_aside", []) + b.get("missing", [])}

    def joins(self, seq, prev, after, after_hash) -> int | None:
        """The `reseal` entry that re-joins entry `seq` (whose `prev` is `prev`) to entry `after`
        (hash `after_hash`), or None."""
        for e, body in self.bodies.items():
            if e < seq:
                continue
            gap = set(body.get("set_aside", [])) | set(body.get("missing", []))
            between = range(after + 1, seq)
            if not between or not all(k in gap for k in between):
                continue
            for link in body.get("links", []):
                if (link["seq"], link["prev"], link["after"], link["after_hash"]) == (seq, prev, after, after_hash):
                    return e
        return None

    def notes(self, e) -> list[Problem]:
        """What fsck says about re-seal `e` every time after: the damaged steps, named."""
        body = self.bodies.get(e)
        if body is None:
            return []
        out = [Problem(f"entry {n['seq']} ({n.get('kind') or 'unreadable'} of step {n.get('step')}) "
                       f"did not verify ({n['why']}) and was set aside by `envgit fsck --repair` "
                       f"(entry {e}): kept as it was in the set_aside table, read without it", e, blocks=False)
               for n in body.get("named", [])]
        if body.get("missing"):
            many = len(body["missing"]) > 1
            out.append(Problem(f"entr{'ies' if many else 'y'} {ranges(body['missing'])} "
                               f"{'were' if many else 'was'} missing when `envgit fsck --repair` "
                               f"re-sealed the journal (entry {e}): the chain is re-joined past them",
                               e, blocks=False))
        for n in body.get("closed", []):
            out.append(Problem(f"step {n}: the entry that ended it was set aside or missing, so the "
                               f"re-sealed journal (entry {e}) closes it as interrupted: how it ended "
                               "and its snapshot are not known", e, blocks=False))
        return out

    def steps(self) -> dict[int, str]:
        """step -> what a re-seal did to it, for a rewind to name (to it, or across it)."""
        out: dict[int, list] = {}
        for body in self.bodies.values():
            for n in body.get("named", []):
                if n.get("step") is not None:
                    out.setdefault(n["step"], []).append(f"entry {n['seq']} ({n.get('kind')})")
            for n in body.get("closed", []):
                if n not in out:            # its end went aside as another step's (renumbered)
                    out[n] = ["the entry that ended it"]
        return {n: f"step {n}: {', '.join(what)} did not verify and "
                   f"{'was' if len(what) == 1 else 'were'} set aside by `envgit fsck --repair` "
                   "(`envgit fsck` names it)" for n, what in out.items()}


def _hash_ok(seq, step, kind, at, text, p, h) -> bool:
    try:
        return entry_hash(seq, step, kind, at, text, p) == h
    except (TypeError, ValueError):
        return False


def _own_fault(row) -> str | None:
    seq, step, kind, at, text, p, h = row
    if type(step) is not int or type(at) is not int:
        return "its step or time is not a number"
    if not _hash_ok(*row):
        return "its hash does not match what it holds: changed after it was written"
    _, wrong = read_body(kind, text)
    if wrong:
        return "; ".join(wrong)
    if seq == 1 and p != GENESIS:
        return "it is entry 1 but does not start the chain"
    return None


def ranges(seqs) -> str:
    from .salvage import ranges as r
    return r(seqs)


def plan(journal) -> dict | None:
    """What a re-seal would do: {aside: {seq: why}, missing, links, closed, last, prev}, or None
    when every row verifies (nothing to do)."""
    with journal.lock:
        rows = journal.db.execute(f"SELECT {COLUMNS} FROM entries ORDER BY seq").fetchall()
        open_before = {r[0] for r in journal.db.execute("SELECT step FROM open_steps")}
    seals = Seals(journal)
    gaps = journal._repaired_gaps()
    accepted = set(gaps) | seals.covered
    present = {r[0]: r for r in rows}
    last = rows[-1][0] if rows else 0
    aside = {r[0]: why for r in rows if (why := _own_fault(r))}
    for seq, *_, h in rows:     # a row the next one disowns (names another hash as prev) was
        nxt = present.get(seq + 1)  # rewritten with its hash recomputed, or the next was
        if seq not in aside and nxt is not None and nxt[5] != h:
            aside[seq] = f"entry {seq + 1} names another entry before it"
    if not aside and not any(s not in present and s not in accepted for s in range(1, last + 1)):
        return None
    kept = [r for r in rows if r[0] not in aside]
    e = last + 1
    links, a, ah = [], 0, GENESIS
    for seq, p, h in [(r[0], r[5], r[6]) for r in kept] + [(e, None, None)]:
        p = ah if p is None else p          # the reseal entry itself follows the last kept row
        known = seq != a + 1 and all(k in gaps for k in range(a + 1, seq))
        if not (seq == a + 1 and p == ah) and not known and seals.joins(seq, p, a, ah) is None:
            links.append({"seq": seq, "prev": p, "after": a, "after_hash": ah})
        a, ah = seq, h
    missing = sorted({k for link in links for k in range(link["after"] + 1, link["seq"])} - set(aside))
    return {"aside": aside, "missing": missing, "links": links, "rows": present, "seq": e,
            "prev": kept[-1][6] if kept else GENESIS, "closed": _closed(journal, kept, open_before)}


def _closed(journal, kept, open_before) -> list[int]:
    """Steps the kept rows leave open that the journal had closed: their closing entry went aside."""
    out: dict = {}
    for seq, step, kind, at, text, _, _ in kept:
        if kind == "begin" or kind in CLOSING:
            fold_entry(out, seq, step, kind, at, text)
    return sorted(n for n, s in out.items() if s.status == "running" and n not in open_before)


def repair(journal) -> str | None:
    """Re-seal the journal (the caller is its only writer: it holds the daemon lock). One
    transaction: the rows set aside, the `reseal` entry, the steps it closes, the open-steps
    table. Returns what was done, in words, or None when every row verified."""
    with journal.lock:
        p = plan(journal)
        if p is None:
            return None
        e, prev = p["seq"], p["prev"]
        named = []
        for seq, why in sorted(p["aside"].items()):
            _, step, kind, *_ = p["rows"][seq]
            named.append({"seq": seq, "step": step if type(step) is int else None,
                          "kind": kind if isinstance(kind, str) else None, "why": why})
        body = {"set_aside": sorted(p["aside"]), "missing": p["missing"], "links": p["links"],
                "named": named, "closed": p["closed"],
                "reason": f"{len(p['aside'])} entries did not verify and were set aside"
                          + (f", {len(p['missing'])} were missing" if p["missing"] else "")}
        db = journal.db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute(SET_ASIDE_SCHEMA)
            for seq, why in sorted(p["aside"].items()):
                db.execute(f"INSERT INTO set_aside SELECT {COLUMNS}, ?, ? FROM entries WHERE seq = ?", (e, why, seq))
                db.execute("DELETE FROM entries WHERE seq = ?", (seq,))
            seq, step, kind = e, 0, "reseal"
            for n in [None] + p["closed"]:
                if n is not None:
                    seq, step, kind = seq + 1, n, "interrupted"
                    body = {"reason": f"the entry that ended it did not verify or was missing, and "
                                      f"`envgit fsck --repair` set it aside (entry {e}): how it ended "
                                      "and its snapshot are not known"}
                text, at = check_entry(step, kind, body), time.time_ns()
                h = entry_hash(seq, step, kind, at, text, prev)
                db.execute(f"INSERT INTO entries ({COLUMNS}) VALUES (?,?,?,?,?,?,?)",
                           (seq, step, kind, at, text, prev, h))
                prev = h
            journal._fill_open_steps()
            faults.point("reseal-inserted")     # a kill here leaves the journal as it was
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        journal.tip = (seq, prev)       # its own rows: not a tail changed under the writer
        journal.head.write(seq, prev, journal.floor)
    said = [f"set aside entries {ranges(p['aside'])} (kept in the set_aside table)" if p["aside"] else "",
            (f"entr{'ies' if len(p['missing']) > 1 else 'y'} {ranges(p['missing'])} "
             f"{'were' if len(p['missing']) > 1 else 'was'} missing") if p["missing"] else "",
            f"closed step{'s' * (len(p['closed']) > 1)} {', '.join(map(str, p['closed']))} as interrupted"
            if p["closed"] else ""]
    return (f"fsck: re-sealed the journal (entry {e}): " + "; ".join(x for x in said if x)
            + "; rewinds past them are trusted again")


def named_steps(journal) -> dict[int, str]:
    return Seals(journal).steps()


def headless(journal, n: int) -> str | None:
    """What to say of step `n` when it has entries but no `begin` in a re-sealed journal (its
    begin was the row deleted), or None."""
    seals = Seals(journal)
    if not seals.bodies:
        return None
    with journal.lock:
        if journal.db.execute("SELECT 1 FROM entries WHERE step = ? LIMIT 1", (n,)).fetchone() is None:
            return None
    gone = ranges(sorted(seals.covered))
    return (f"step {n}: its begin is not in the journal (among entries {gone}, set aside or missing "
            "when `envgit fsck --repair` re-sealed it; `envgit fsck` names them)")
