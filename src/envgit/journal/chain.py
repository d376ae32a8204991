"""The entries table and its hash chain (docs/FORMAT.md, "Journal"): the schema of each
format version, the hash an entry carries, the first entry's `prev`."""

import hashlib
import json

GENESIS = "0" * 64
LAST_ROW = "SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1"
FORMAT_VERSION = 2          # PRAGMA user_version; 0 is a journal made before it was set (= 1)
# Version 2 adds `open_steps` (the steps with a begin and no end yet, kept in the same
# transaction as the entry that opens or closes one) and an index on (kind, step), so that
# opening a journal, `log -n`, `show` and a daemon's start read a few rows, not all of them.
# A version-1 journal is migrated by its first writer; a reader of one folds it whole.
SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq   INTEGER PRIMARY KEY,
    step  INTEGER NOT NULL,
    kind  TEXT NOT NULL,
    at_ns INTEGER NOT NULL,
    body  TEXT NOT NULL,
    prev  TEXT NOT NULL,
    hash  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_step ON entries(step);
"""
SCHEMA_V2 = """
CREATE TABLE IF NOT EXISTS open_steps (step INTEGER PRIMARY KEY);
CREATE INDEX IF NOT EXISTS entries_kind_step ON entries(kind, step);
"""
CLOSING = ("end", "interrupted")


def entry_hash(seq, step, kind, at_ns, body, prev) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([seq, step, kind, at_ns, body, prev], separators=(",", ":")).encode())
    return h.hexdigest()
