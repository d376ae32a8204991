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

from ..inert import inert_json
from ..paths import NoProject

# What the commands share with the page, the export and the launchers is view/'s (the floor
# below commands/, ui/ and export/); the commands take these names from here, as above.
from ..view.errors import EXIT_DAEMON, EXIT_FAILED, EXIT_JOURNAL, EXIT_STORE, EXIT_USAGE, Refused, operational
from ..view.names import agent_of, iso_times, iso_utc, session_short, shell_line, shell_word
from ..view.requests import ask_daemon, open_journal, progress

__all__ = ["EXIT_DAEMON", "EXIT_FAILED", "EXIT_JOURNAL", "EXIT_STORE", "EXIT_USAGE", "operational",
           "agent_of", "iso_times", "iso_utc", "session_short", "shell_line", "shell_word",
           "ask_daemon", "open_journal", "progress", "Usage"]

# The command modules, in the order `envgit --help` lists them.
MODULES = ("setup", "timeline", "diff", "snapshot", "rewind", "adopt", "gc", "asks", "grants", "stats", "export",
           "ui", "fsck", "remote", "trust", "completion", "ps", "compare", "branch", "learn")
# Which module's add_parsers makes each command: a command builds only its own module's parsers
# (cli.py), not all twenty (importing them all cost every command ~30 ms). Pinned by
# tests/test_cli_conventions.py against what each module registers.
COMMAND_MODULE = {
    "init": "setup", "demo": "setup", "doctor": "setup", "policy": "setup", "daemon": "setup",
    "log": "timeline", "show": "timeline", "diff": "diff", "ls": "snapshot", "cat": "snapshot",
    "restore": "snapshot", "rewind": "rewind", "adopt": "adopt", "gc": "gc", "pending": "asks",
    "approve": "asks", "deny": "asks", "grants": "grants", "stats": "stats", "export": "export",
    "ui": "ui", "fsck": "fsck", "remote": "remote", "push": "remote", "audit": "remote",
    "trust": "trust", "completion": None, "ps": "ps", "compare": "compare", "fork": "branch",
    "branches": "branch", "branch": "branch", "learn": "learn",
}       # None: needs the whole command tree (completion reads it)


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
    except Refused as e:                # Usage, or a refusal from view/ (the daemon's, Secrets')
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


def out(obj):
    """The one JSON document of a --json command, on stdout: every time in it (a key `at` or
    `*_at`) as ISO-8601 UTC, whatever the part that answered kept (the journal and daemon
    keep some as epoch seconds); controls made inert."""
    print(inert_json(json.dumps(iso_times(obj), indent=2, ensure_ascii=False)))


# Everything a step, an agent or a server chose (names, paths, refs, hosts, command lines,
# marks) goes through inert() before it is printed: see inert.py.


class Usage(Refused):
    """The CLI's error: `raise Usage("what is wrong; the fix", code)`."""


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
