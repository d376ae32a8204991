"""`journal.head`: how far the journal reached, kept outside SQLite (docs/FORMAT.md, "Head
record"). Standard library only."""

import json
import os
import time

HEAD_FILE = "journal.head"


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

    def write(self, seq: int, h: str, step: int) -> None:
        """One pwrite of a fixed-size record over the old one (~5 µs; a temporary file and a
        rename cost ~300 µs an entry here). A kill cannot tear a pwrite this small; a power
        loss could, and a torn record reads as damaged, which fsck says."""
        rec = json.dumps({"seq": seq, "hash": h, "step": step}, sort_keys=True).encode()
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
        """The record, or None if there is none; a damaged one is told to `problem` (after a
        second look: the writer may have been halfway through rewriting it)."""
        for _ in range(3):
            try:
                with open(self.path) as f:
                    rec = json.loads(f.read())
            except FileNotFoundError:
                return None
            except (OSError, ValueError):
                rec = None
            if isinstance(rec, dict):
                break
            time.sleep(0.02)
        if not (isinstance(rec, dict) and type(rec.get("seq")) is int and type(rec.get("step")) is int
                and isinstance(rec.get("hash"), str)):
            if problem:
                from . import Problem
                problem(Problem(f"{HEAD_FILE} is damaged: a lost tail cannot be told until the next "
                                "entry rewrites it", blocks=False))
            return None
        return rec
