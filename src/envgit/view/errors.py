"""How envgit says a failure: the stable exit codes, the error a request refused raises, and
the one line (with the fix) for an operational failure of the daemon, store or journal."""

import sys

# Exit codes of operational failures (cli.py's docstring lists them all): stable, so scripts
# can tell "fix the command" from "the daemon is gone" from "the store or journal is damaged".
EXIT_FAILED, EXIT_USAGE, EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL = 1, 2, 3, 4, 5


class Refused(Exception):
    """What was asked cannot be done: its text says why and the fix. commands.Usage (the CLI's
    error) is one; the page shows its text."""

    def __init__(self, text, code=None):
        super().__init__(text)
        self.code = code        # an operational exit code (EXIT_DAEMON…) the daemon gave, if any


def operational(e: Exception):
    """(one line with the fix, exit code) for a failure of the machine, the daemon or the
    data rather than of envgit's code; None for anything else."""
    import sqlite3

    from ..daemon.client import DaemonError
    from ..journal import JournalError
    if isinstance(e, DaemonError):
        return (f"{e}; run the command again (it starts a new session daemon)", EXIT_DAEMON)
    if isinstance(e, JournalError):
        return (f"{e}; `envgit fsck` says what is damaged", EXIT_JOURNAL)
    if isinstance(e, sqlite3.DatabaseError):
        return (f"the journal (.envgit/journal.sqlite) cannot be read: {e}; `envgit fsck` says "
                "what is damaged, `envgit fsck --repair` keeps every entry it can read", EXIT_JOURNAL)
    snapshot = sys.modules.get("envgit.snapshot")    # loaded only by commands that use the store
    if snapshot is not None and isinstance(e, (snapshot.StoreError, snapshot.CorruptObject)):
        return (f"{e}; `envgit fsck` lists what is damaged in the snapshot store", EXIT_STORE)
    if isinstance(e, OSError):
        return (f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), EXIT_FAILED)
    return None
