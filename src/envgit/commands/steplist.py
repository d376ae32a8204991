"""A list of steps as `log` says it: one line per step (print_steps), and each step's JSON
(step_json: `show --json` and `log --json`, docs/JSON.md); for the journal's steps (timeline.py)
and a remote's (remote.py: `log --remote`)."""

import sys

from ..inert import inert
from ..view.names import what_ran
from . import agent_of, session_short

# How many lines of a long command `log` shows per step on a terminal unless --no-trunc.
LOG_LINES = 4

# A step's snapshot summary (daemon/snapshots.py), every key present: a snapshot that could
# not be taken has only `error` set; `diff_error` says why its change list is missing.
SNAPSHOT_KEYS = ("tree", "added", "modified", "deleted", "dirs_changed", "bytes", "ms", "paths",
                 "paths_truncated", "left_out", "stats", "error", "diff_error", "taken_at")


def step_json(s) -> dict:
    """A step as `show --json` and each element of `log --json` give it (docs/JSON.md)."""
    d = {**s.to_json(), "agent": agent_of(s.session)}
    if isinstance(d.get("snapshot"), dict):
        d["snapshot"] = {k: d["snapshot"].get(k) for k in SNAPSHOT_KEYS}
    return d


def print_steps(steps, args) -> None:
    """The log's lines: one per step piped, the command wrapped under itself on a terminal."""
    if not steps:
        print("no steps match")
        return
    import shutil
    import textwrap
    width = shutil.get_terminal_size((100, 24)).columns if sys.stdout.isatty() else None
    sw = max(len(session_short(s.session)) for s in steps)      # the session column's width
    for s in steps:
        exit_ = {"running": "run", "interrupted": "int"}.get(
            s.status, "-" if s.exit_code is None else str(s.exit_code))   # `outside`: no command
        marks = " [" + inert(",".join(s.marks)) + "]" if s.marks else ""
        head = (f"{s.id:>4}  {s.started_at[:19].replace('T', ' ')}  exit {exit_:>3}  "
                f"{_duration(s.duration_ms):>7}  {session_short(s.session):{sw}}  ")
        line = what_ran(s) + marks
        if width is None:               # piped: one line per step, the whole command
            print(head + line)
            continue
        # the command's column, wrapped under itself; a terminal too narrow for it gets the
        # command on lines of its own
        indent = " " * (len(head) if width - len(head) >= 16 else 6)
        if len(indent) < len(head):
            print(head.rstrip())
            head = indent
        lines = textwrap.wrap(line, width - len(indent), break_long_words=True,
                              break_on_hyphens=False) or [""]
        if not args.no_trunc and len(lines) > LOG_LINES:
            lines = lines[:LOG_LINES - 1] + [lines[LOG_LINES - 1][:-1] + "…"]
        print(head + lines[0])
        for more in lines[1:]:
            print(indent + more)


def _duration(ms):
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    return f"{ms / 60_000:.0f}m{ms / 1000 % 60:02.0f}s"
