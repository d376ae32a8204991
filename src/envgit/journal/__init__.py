"""The step journal: an append-only, hash-chained log of entries in SQLite (WAL).

Nothing is ever updated in place. A step is the fold of its entries:
  begin        argv, cwd, started_at, policy_sha256, user, session, pid, …
  end          exit_code, signal, ended_at, duration_ms, marks, denied_paths, …
  interrupted  the step's client or daemon died before `end`
  request / approval / snapshot / …   what later parts add, each an entry of its own
Each entry carries the hash of the one before it, so `fsck` can prove no entry was changed,
dropped or reordered. The format is in docs/FORMAT.md.

Rows are checked on the way in (`check_entry`: a known kind, a JSON object whose known keys
have their types) and read defensively on the way out: a row that is not what it should be is
skipped by the fold and named by `verify`, so one bad row never stops the rest.

Next to the database, `journal.head` (written after every entry, outside SQLite) says how far
the journal reached; a journal found short of it lost its tail (a truncated or deleted WAL),
which the next writer records as a `lost` entry, and step ids continue past the lost ones.

Only the standard library: `envgit log` and `show` read the journal without the daemon.

The implementation is in the package's modules (log.py: `Journal`; chain.py, fold.py,
errors.py, head.py, rows.py, and the repairs); what others import is named here.
"""

from .chain import FORMAT_VERSION, GENESIS, entry_hash
from .errors import JournalError, Problem, disk_full
from .fold import Step, utc
from .head import HeadRecord
from .log import Journal

__all__ = ["FORMAT_VERSION", "GENESIS", "HeadRecord", "Journal", "JournalError", "Problem", "Step",
           "disk_full", "entry_hash", "utc"]
