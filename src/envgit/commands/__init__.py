"""What each porcelain command does: call the part that owns the work, render its answer.

One module per family of commands; each has `add_parsers(sub, argparse)` (its part of the
command line) and the functions its parsers name. This module holds what they share, and
every command follows it the same way:

- **A parser** is made with `command(sub, name, help=…, example=…)`: `help` is its line in
  `envgit --help`, `example` (one or more `envgit …` lines, required) is printed under
  "example:" (or "examples:") at the end of `envgit NAME --help`. No command is hidden: every one has a `help`.
- **A step argument** is `type=step_ref, help=STEP_HELP` (a number, `last`, `last~K`), turned
  into a step number in the function by `resolve_step(journal, ref)`, which raises Usage
  when there is no such step. Never `type=int` for a step.
- **--json** is added by `json_flag(parser)`. The answer is printed once, by `out(obj)`.
  Every key the command documents in docs/JSON.md is always present (None when there is
  nothing), times are ISO-8601 UTC strings made by `iso_utc` (`2026-12-03T11:28:45.123456Z`),
  never epoch numbers; sizes are bytes; durations are milliseconds named `*_ms`.
- **An error** is raised, not printed: `raise Usage("what is wrong; the fix", code)` (code
  defaults to EXIT_USAGE; an operational failure of the daemon, store or journal may simply
  propagate, `operational` turns it into its line and code). `dispatch` renders it: one
  `envgit: …` line on stderr, or, with --json, the JSON document `{"error": TEXT, "exit": CODE}`
  on stdout (stdout always carries exactly one JSON document under --json) and nothing on
  stderr. argparse's own usage errors follow the same rule (cli.py).
- **Progress** of a long operation goes through `progress(total, unit)` (tqdm on stderr when
  stderr is a terminal, silent otherwise); the daemon's `progress` pushes are shown by
  `ask_daemon` the same way.
- Output into a closed pipe (`envgit log | head -1`) ends quietly, the way git does: cli.py
  catches the BrokenPipeError and the process dies of SIGPIPE.
"""

import json
import sys

from ..inert import inert, inert_json
from ..paths import NoProject

# Exit codes of operational failures (cli.py's docstring lists them all): stable, so scripts
# can tell "fix the command" from "the daemon is gone" from "the store or journal is damaged".
EXIT_FAILED, EXIT_USAGE, EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL = 1, 2, 3, 4, 5

# The command modules, in the order `envgit --help` lists them.
MODULES = ("setup", "timeline", "diff", "snapshot", "rewind", "gc", "asks", "grants", "stats", "export", "ui", "fsck",
           "remote", "trust")


# --- parsers ----------------------------------------------------------------------------

def command(sub, name, *, help, example, **kw):
    """A command's parser: listed in `envgit --help` with `help`, its `--help` ending with the
    example (an `envgit …` line, or several separated by newlines)."""
    import argparse
    lines = [example] if isinstance(example, str) else list(example)
    epilog = ("example:\n" if len(lines) == 1 else "examples:\n") + "\n".join(f"  {line}" for line in lines)
    return sub.add_parser(name, help=help, description=kw.pop("description", help), epilog=epilog,
                          formatter_class=argparse.RawDescriptionHelpFormatter, **kw)


def json_flag(parser):
    parser.add_argument("--json", action="store_true",
                        help="print one JSON document instead (its keys: docs/JSON.md)")


# --- errors ------------------------------------------------------------------------------

def dispatch(args) -> int:
    fn = args.fn
    try:
        return fn(args)
    except BrokenPipeError:
        raise                           # the reader went away: cli.py ends quietly
    except NoProject as e:
        return fail(args, str(e), EXIT_USAGE)
    except Usage as e:
        return fail(args, str(e), e.code or EXIT_USAGE)
    except Exception as e:
        said = operational(e)
        if said is None:
            raise                       # a bug: its traceback is what a report needs
        text, code = said
        return fail(args, text, code)


def fail(args, text, code) -> int:
    """Say an error the command's way: one `envgit:` line on stderr, or with --json the
    document {"error", "exit"} on stdout. Returns the exit code."""
    text = str(text).removeprefix("envgit: ")
    if getattr(args, "json", False):
        out({"error": text, "exit": code})
    else:
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
    """The one JSON document of a --json command, on stdout: every time in it (a key `at` or
    `*_at`) as ISO-8601 UTC, whatever the part that answered kept (the journal and daemon
    keep some as epoch seconds); controls made inert."""
    print(inert_json(json.dumps(iso_times(obj), indent=2, ensure_ascii=False)))


def iso_times(obj):
    if isinstance(obj, dict):
        return {k: iso_utc(v) if (k == "at" or k.endswith("_at")) and isinstance(v, (int, float))
                and not isinstance(v, bool) else iso_times(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [iso_times(v) for v in obj]
    return obj


def iso_utc(t) -> str | None:
    """A time as ISO-8601 UTC with microseconds and Z: from epoch seconds (int or float), epoch
    nanoseconds (an int past 10**15), or text already in that form; None stays None."""
    if t is None or isinstance(t, str):
        return t
    from ..journal import utc
    ns = int(t) if isinstance(t, int) and t > 10**15 else int(round(t * 1_000_000_000))
    return utc(ns)


# --- progress ----------------------------------------------------------------------------

def progress(total=None, unit="it", desc=None):
    """A progress bar on stderr while stderr is a terminal (tqdm); silent when piped or
    redirected. Use as a context manager; `.update(n)`, `.total`, `.n`."""
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=False,
                disable=not sys.stderr.isatty(), dynamic_ncols=True)


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
    """The daemon's reply to `msg`; its `progress` pushes meanwhile drive a progress bar on a
    terminal ({"done", "total", "unit"} when the daemon counts, else only "text")."""
    from ..daemon.client import connect
    conn = connect(project)
    bar = None

    def on_push(frame):
        nonlocal bar
        if frame.get("push") != "progress":
            return
        if bar is None:
            bar = progress(frame.get("total"), frame.get("unit") or "it", frame.get("what"))
        if frame.get("total") is not None:
            bar.total = frame["total"]
        if frame.get("done") is not None:
            bar.update(frame["done"] - bar.n)
        else:
            bar.set_description_str(inert(str(frame.get("text", ""))))
    conn.on_push = on_push
    try:
        reply = conn.request(msg)
    finally:
        if bar is not None:
            bar.close()
    if "error" in reply:
        code = reply.get("exit")
        raise Usage(reply["error"].removeprefix("envgit: "),
                     code if code in (EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL) else None)
    reply.pop("rid", None)              # the protocol's request id, not part of the answer
    return reply


# --- rendering ---------------------------------------------------------------------------

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-")


def shell_word(arg: str) -> str:
    """One argument quoted as a person would type it in bash: bare when it can be, else in
    single quotes, double quotes when it holds a single quote and nothing double quotes would
    expand, and $'…' with escapes (\\n, \\x1b, \\u202e) when it holds controls; always inert."""
    arg = str(arg)
    if arg and all(c in _PLAIN for c in arg):
        return arg
    if inert(arg) != arg:               # a newline, a tab, an escape, a bidi control
        return "$'" + inert(arg.replace("\\", "\\\\").replace("'", "\\'")) + "'"
    if "'" not in arg:
        return f"'{arg}'"
    if not any(c in arg for c in '"$`\\!'):
        return f'"{arg}"'
    return "'" + arg.replace("'", "'\\''") + "'"


def shell_line(argv) -> str:
    """A command line as a person would type it (shell_word for each argument), inert."""
    return " ".join(shell_word(a) for a in argv or ())


def agent_of(session: str | None) -> str:
    """Which launcher made a session: `claude`, `codex`, `copilot` (its id starts with the agent's
    name: agents/session.py), else `run` (the daemon's own session: `envgit run` by hand)."""
    s = session or ""
    head = s.split("-", 1)[0]
    if not s or (head[:1] == "s" and head[1:].isdigit()) or not head.isalpha():
        return "run"
    return head


def session_short(session: str | None) -> str:
    """The session as the log's column shows it: agent and the id's last part (`claude:3fa2`)."""
    return f"{agent_of(session)}:{(session or '-').rsplit('-', 1)[-1]}"


# --- step references ---------------------------------------------------------------------

STEP_HELP = "a step: its number, `last` (the newest snapshot), or `last~K` (K steps before it)"


STEP_MAX = (1 << 63) - 1        # SQLite's integer: a bigger number names no step


def step_ref(text) -> str:
    """An argparse type for a step reference: checked for shape here, resolved against the
    journal by resolve_step (argparse cannot open the journal)."""
    import argparse
    t = str(text)
    if t.isdigit() and 1 <= int(t) <= STEP_MAX:
        return t
    if t == "last" or (t.startswith("last~") and t[5:].isdigit() and int(t[5:]) <= STEP_MAX):
        return t
    if t.removeprefix("last~").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: no step has a number that large "
                                         f"(at most {STEP_MAX}); `envgit log` lists them")
    raise argparse.ArgumentTypeError(f"{text!r}: give a step number (1 or more), `last` or `last~K`")


def resolve_step(j, ref) -> int:
    """The step number a reference names: N itself; `last` the newest step, the one whose
    snapshot was taken last (steps run at once: the highest number may have ended first, with
    less in its tree); `last~K` the K-th step before it in that order (steporder.py).
    Raises Usage when there is no such step."""
    ref = str(ref)
    if ref.isdigit():
        return int(ref)
    from ..steporder import newest_first
    back = int(ref[5:]) if ref.startswith("last~") else 0
    seen = 0
    for r in newest_first(j) if j else ():
        if seen == back:
            return r.step
        seen += 1
    raise Usage(f"no step {ref}: the journal has {seen} step(s); `envgit log` lists them")
