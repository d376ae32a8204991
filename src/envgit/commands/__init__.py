"""What each porcelain command does: call the part that owns the work, render its answer.

One module per family of commands; each has `add_parsers(sub, argparse)` (its part of the
command line, every parser carrying `fn=` the function that runs it) and the functions
themselves. This module holds what they share: exit codes, the error convention, JSON output.
"""

import json
import sys

from ..inert import inert_json
from ..paths import NoProject


# Exit codes of operational failures (cli.py's docstring lists them all): stable, so scripts
# can tell "fix the command" from "the daemon is gone" from "the store or journal is damaged".
EXIT_FAILED, EXIT_USAGE, EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL = 1, 2, 3, 4, 5

# The command modules, in the order `envgit --help` lists them.
MODULES = ("setup", "timeline", "diff", "snapshot", "rewind", "gc", "asks", "fsck")


def dispatch(args) -> int:
    fn = args.fn
    try:
        return fn(args)
    except NoProject as e:
        print(f"envgit: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:
        said = operational(e)
        if said is None:
            raise                       # a bug: its traceback is what a report needs
        text, code = said
        print(f"envgit: {text}", file=sys.stderr)
        return code


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


def out(obj):
    print(inert_json(json.dumps(obj, indent=2, ensure_ascii=False)))


# Everything a step, an agent or a server chose (names, paths, refs, hosts, command lines,
# marks) goes through inert() before it is printed: see inert.py.


def open_journal(project):
    from ..daemon.repair import repair_if_no_daemon
    from ..journal import Journal
    repair_if_no_daemon(project)
    try:
        return Journal(project.journal, readonly=True)
    except FileNotFoundError:
        return None


class Usage(Exception):
    def __init__(self, text, code=None):
        super().__init__(text)
        self.code = code        # an operational exit code (EXIT_DAEMON…) the daemon gave, if any


def ask_daemon(project, msg):
    from ..daemon.client import connect
    conn = connect(project)
    conn.on_push = lambda f: print(f"envgit: {f['text']}", file=sys.stderr) if f.get("push") == "progress" else None
    reply = conn.request(msg)
    if "error" in reply:
        code = reply.get("exit")
        raise Usage(reply["error"].removeprefix("envgit: "),
                     code if code in (EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL) else None)
    return reply


def argparse_namespace(**kw):
    import argparse
    return argparse.Namespace(**kw)


# --- step references ---------------------------------------------------------------------

STEP_HELP = "a step: its number, `last`, or `last~K` (K steps before the last)"


def step_ref(text) -> str:
    """An argparse type for a step reference: checked for shape here, resolved against the
    journal by resolve_step (argparse cannot open the journal)."""
    import argparse
    t = str(text)
    if t.isdigit() and int(t) >= 1:
        return t
    if t == "last" or (t.startswith("last~") and t[5:].isdigit()):
        return t
    raise argparse.ArgumentTypeError(f"{text!r}: give a step number (1 or more), `last` or `last~K`")


def resolve_step(j, ref) -> int:
    """The step number a reference names: N itself; `last` the highest step; `last~K` the
    K-th step before it (counting steps that exist, as `git log`'s HEAD~K counts commits).
    Raises Usage when there is no such step."""
    ref = str(ref)
    if ref.isdigit():
        return int(ref)
    back = int(ref[5:]) if ref.startswith("last~") else 0
    steps = j.steps(last=back + 1) if j else []
    if len(steps) < back + 1:
        raise Usage(f"no step {ref}: the journal has {len(steps)} step(s); `envgit log` lists them")
    return steps[0].id
