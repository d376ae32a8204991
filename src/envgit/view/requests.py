"""What the CLI and `envgit ui` ask of the session: the journal to read (open_journal), the
daemon's answer to a request (ask_daemon), and the requests both send (rewind_message)."""

import os
import sys

from ..inert import inert
from .errors import EXIT_DAEMON, EXIT_JOURNAL, EXIT_STORE, Refused


def open_journal(project):
    """The project's journal, read-only (repaired first when no daemon holds it); None when
    there is none yet."""
    from ..daemon.repair import repair_if_no_daemon
    from ..journal import Journal
    repair_if_no_daemon(project)
    try:
        return Journal(project.journal, readonly=True)
    except FileNotFoundError:
        return None


class _Silent:
    """What `progress` gives when stderr is not a terminal: counts, draws nothing. Not tqdm's
    own `disable=True`, since importing tqdm costs a piped command (a script's, an agent's
    `envgit fsck`) 20 ms of CPU for a bar it never shows."""

    def __init__(self, total=None):
        self.total, self.n = total, 0

    def update(self, n=1):
        self.n += n

    def set_description_str(self, text=None):
        pass

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def progress(total=None, unit="it", desc=None):
    """A progress bar on stderr while stderr is a terminal (tqdm); silent when piped or
    redirected. Use as a context manager; `.update(n)`, `.total`, `.n`."""
    if not sys.stderr.isatty():
        return _Silent(total)
    from tqdm import tqdm
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def ask_daemon(project, msg):
    """The daemon's reply to `msg`; its `progress` pushes meanwhile drive a progress bar on a
    terminal ({"done", "total", "unit"} when the daemon counts, else only "text"). An error
    reply raises Refused with its text (and its exit code when operational)."""
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
        raise Refused(reply["error"].removeprefix("envgit: "),
                      code if code in (EXIT_DAEMON, EXIT_STORE, EXIT_JOURNAL) else None)
    reply.pop("rid", None)              # the protocol's request id, not part of the answer
    return reply


def rewind_message(step, undo=False, paths=None, policy=False) -> dict:
    """The daemon request for a rewind's preview (add "apply": True to do it): the one way
    the CLI and `envgit ui` ask for a rewind."""
    return {"op": "rewind", "step": step, "undo": undo, "paths": paths or None,
            "policy": policy, "uid": os.getuid()}
