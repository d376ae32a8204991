"""What the journal says went wrong: an entry it will not write or a journal it cannot read
(JournalError), a full disk (disk_full), and one thing `verify` found (Problem)."""

import sqlite3


class JournalError(Exception):
    """An entry that cannot be written as asked, or a journal that does not verify."""


def disk_full(e: BaseException) -> bool:
    """Whether `e` is the disk (or quota) being full: SQLite's SQLITE_FULL, its WAL index that
    could not be sized (SQLITE_IOERR_SHMSIZE: what opening the journal on a full disk says as
    "disk I/O error"), or ENOSPC/EDQUOT."""
    import errno
    if isinstance(e, sqlite3.OperationalError):
        return "full" in str(e) or getattr(e, "sqlite_errorname", "") == "SQLITE_IOERR_SHMSIZE"
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


class Problem(str):
    """One thing `verify` found, as text. `blocks`: whether a rewind to a step whose entries
    end at seq T must refuse, which it does for `seq` <= T (<= `until` when set): a changed
    entry k taints every target at or after it; a history found rewritten up to entry b taints
    the targets up to b (None: the journal as a whole)."""

    seq: int | None
    blocks: bool
    until: int | None

    def __new__(cls, text, seq=None, blocks=True, until=None):
        p = super().__new__(cls, "journal: " + text)
        p.seq, p.blocks, p.until = seq, blocks, until
        return p

    def taints(self, target_seq: int) -> bool:
        return self.blocks and (self.seq is None or self.seq <= target_seq) and \
            (self.until is None or target_seq <= self.until)
