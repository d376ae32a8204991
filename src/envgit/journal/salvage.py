"""A damaged journal.sqlite ("database disk image is malformed", "file is not a database"):
what is damaged, and a rebuild that keeps every entry that can still be read.

`inspect` reads the entries one seq at a time (a damaged page costs the rows on it, not the
rest) and says which could not be read. `rebuild` writes those rows, unchanged (their seq,
prev and hash), into a new journal.sqlite, keeps the damaged file beside it, and appends a
`lost` entry naming the entries it could not keep (`missing`), so that `verify` names the gap
every time after and rewind still trusts the chain on either side of it (the rows it kept are
each checked against their own hash and their neighbours').

When SQLite cannot open the file at all (its header page is damaged), a copy with a fresh
header is tried before giving up. Only the standard library."""

import os
import shutil
import sqlite3
import time

COLUMNS = "seq, step, kind, at_ns, body, prev, hash"


class Damage:
    """What a journal file holds, row by row (a plain class: `fsck` should not import
    `dataclasses`' `inspect` for it)."""

    def __init__(self, error: str, rows: list | None = None, unreadable: list | None = None,
                 highest: int = 0):
        self.error = error                      # what SQLite said, or "" when the file reads whole
        self.rows = rows if rows is not None else []                # every row that could be read
        self.unreadable = unreadable if unreadable is not None else []  # seqs that could not be
        self.highest = highest                  # the last seq the journal is known to have reached

    @property
    def damaged(self) -> bool:
        return bool(self.error or self.unreadable)

    def summary(self, path) -> str:
        if not self.damaged:
            return f"{path}: every entry reads"
        gone = ranges(self.unreadable)
        return (f"journal: {path} is damaged ({self.error or 'unreadable rows'}): {len(self.rows)} of "
                f"{self.highest} entries can be read" + (f"; entries {gone} cannot" if gone else "")
                + "; `envgit fsck --repair` rebuilds it keeping every readable entry (snapshots are "
                "not touched)")


def ranges(seqs) -> str:
    out, seqs = [], sorted(seqs)
    i = 0
    while i < len(seqs):
        j = i
        while j + 1 < len(seqs) and seqs[j + 1] == seqs[j] + 1:
            j += 1
        out.append(str(seqs[i]) if i == j else f"{seqs[i]}–{seqs[j]}")
        i = j + 1
    if len(out) > 12:
        out = out[:12] + [f"… ({len(seqs)} in all)"]
    return ", ".join(out)


def _open(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10, isolation_level=None)


def inspect(path, head_seq: int = 0) -> Damage:
    """Read what can be read. `head_seq`: how far the head record says the journal reached."""
    try:
        db = _open(path)
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        fixed = _with_fresh_header(path)
        if fixed is None:
            return Damage(error=str(e), highest=head_seq, unreadable=list(range(1, head_seq + 1)))
        d = inspect(fixed, head_seq)
        d.error = f"{e}; its header was damaged"
        os.unlink(fixed)
        return d
    try:
        return _read_rows(db, head_seq)
    finally:
        db.close()


def _read_rows(db, head_seq) -> Damage:
    d = Damage(error="")
    try:
        said = [m for m, in db.execute("PRAGMA quick_check(20)") if m != "ok"]
        lines = [x.strip() for m in said for x in m.splitlines() if x.strip() and not x.startswith("***")]
        if lines:                       # the first thing SQLite found, short: one line of output
            d.error = lines[0][:160] + (f" (and {len(lines) - 1} more findings)" if len(lines) > 1 else "")
    except sqlite3.DatabaseError as e:
        d.error = str(e)
    try:                                # the fast way when the table reads whole
        d.rows = db.execute(f"SELECT {COLUMNS} FROM entries ORDER BY seq").fetchall()
        last = d.rows[-1][0] if d.rows else 0
        d.highest = max(last, head_seq)
        have = {r[0] for r in d.rows}
        # A file SQLite finds whole that lacks a seq had a row deleted, not a page damaged: the
        # chain names that, and `fsck --repair` re-seals past it (reseal.py), no rebuild.
        d.unreadable = [s for s in range(1, d.highest + 1) if s not in have] if d.error else []
        return d
    except sqlite3.DatabaseError as e:
        d.error = d.error or str(e)
    # One row at a time: the rows on a damaged page are lost, the others are read.
    top = head_seq
    for probe in ("SELECT max(seq) FROM entries", "SELECT max(rowid) FROM entries"):
        try:
            top = max(top, db.execute(probe).fetchone()[0] or 0)
        except sqlite3.DatabaseError:
            pass
    rows, bad = [], []
    seq, misses = 1, 0
    while seq <= top or misses < 64:       # past the known top, a few more in case it was lost
        try:
            row = db.execute(f"SELECT {COLUMNS} FROM entries WHERE seq = ?", (seq,)).fetchone()
        except sqlite3.DatabaseError:
            row = None
        if row is None:
            bad.append(seq)
            misses = misses + 1 if seq > top else 0
        else:
            rows.append(row)
            top = max(top, seq)
            misses = 0
        seq += 1
    d.rows = rows
    d.highest = top
    d.unreadable = [s for s in bad if s <= top]
    return d


def _with_fresh_header(path):
    """A copy of `path` with the 100-byte header of a new database of the same page size, or
    None. The header holds the page size and counts, not the data; a damaged one makes SQLite
    refuse the whole file."""
    tmp = path + ".header-fixed"
    try:
        size = os.path.getsize(path)
        for page in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512):
            if size % page:
                continue
            fresh = tmp + ".new"
            db = sqlite3.connect(fresh)
            db.execute(f"PRAGMA page_size={page}")
            db.execute("CREATE TABLE x (y)")
            db.commit()
            db.close()
            with open(fresh, "rb") as f:
                header = bytearray(f.read(100))
            os.unlink(fresh)
            header[28:32] = (size // page).to_bytes(4, "big")     # pages in the file
            header[32:40] = bytes(8)                              # no freelist known
            shutil.copyfile(path, tmp)
            with open(tmp, "r+b") as f:
                f.write(header)
            try:
                db = _open(tmp)
                db.execute("SELECT count(*) FROM entries").fetchone()
                db.close()
                return tmp
            except sqlite3.DatabaseError:
                continue
    except OSError:
        pass
    for p in (tmp, tmp + ".new"):
        try:
            os.unlink(p)
        except OSError:
            pass
    return None


def rebuild(path, damage: Damage) -> str:
    """Replace the journal at `path` by one holding every readable row; the damaged file (and
    its -wal/-shm) kept beside it. Returns where the damaged copy went. The caller holds the
    daemon lock and then opens the new journal, which records a lost tail if there is one."""
    from .chain import FORMAT_VERSION, SCHEMA, SCHEMA_V2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept_as = f"{path}.damaged-{stamp}"
    new = path + ".rebuilt"
    for p in (new, new + "-wal", new + "-shm"):
        if os.path.exists(p):
            os.unlink(p)
    db = sqlite3.connect(new, isolation_level=None)
    db.executescript(SCHEMA + SCHEMA_V2)
    db.execute("BEGIN")
    db.executemany(f"INSERT OR IGNORE INTO entries ({COLUMNS}) VALUES (?,?,?,?,?,?,?)", damage.rows)
    db.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
    db.execute("COMMIT")
    db.close()
    os.replace(path, kept_as)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.replace(path + suffix, kept_as + suffix)
    os.replace(new, path)
    return kept_as
