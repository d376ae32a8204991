"""Finding steps whose `envgit run` or daemon died (SIGKILL, power loss) and closing them as
`interrupted`: never lost, never left half-written. An open rewind is not closed here but
finished by the daemon (rewind.finish_interrupted), which has the store. Standard library only."""

import fcntl
import os

EXITING_WAIT_S = 5          # how long a read waits for a killed daemon to let go of the lock


def mark_interrupted(journal, reason) -> list[int]:
    """Close every open step but rewinds. Call only as the journal's single writer: the
    daemon at start, or a command holding the daemon lock (so no daemon is running)."""
    done = []
    if journal.lost_now:            # their ends may be among the lost entries: say so, not "died"
        reason = ("the journal lost its later entries (see `envgit fsck`): whether this step "
                  "finished, and how, is not known")
    for s in journal.open_steps():
        if s.rewind:
            continue
        journal.append(s.id, "interrupted", {"reason": reason})
        done.append(s.id)
    return done


def repair_if_no_daemon(project) -> list[int]:
    """What the CLI calls before reading: if no daemon holds the lock, close orphaned steps;
    if a rewind was left open, start the daemon, which finishes it."""
    from ..journal import Journal
    if not os.path.exists(project.journal):
        return []
    with open(project.state_path("daemon.lock"), "a+") as lock:
        if not _take(lock, project):
            return []                   # a daemon is running: it owns the journal
        try:
            j = Journal(project.journal)
        except Exception as e:
            if _said_disk_full(e):
                return []                # read what is there; the next writer repairs
            raise
        try:
            open_steps = j.open_steps()
            done = mark_interrupted(j, "no session daemon was running; the step's envgit run died")
            rewinds = [s for s in open_steps if s.rewind]
        except Exception as e:
            if _said_disk_full(e):
                return []
            raise
        finally:
            j.close()
    if rewinds:
        from .client import DaemonError, connect
        try:
            connect(project).request({"op": "status"})    # its start-up finishes the rewind
        except DaemonError:
            pass        # the reader goes on; the open rewind shows as running, daemon.log says why
    return done


def _take(lock, project) -> bool:
    """The daemon lock, if no live daemon holds it. A daemon that is still exiting (killed, its
    last files being closed) is waited for, a few seconds at most: the steps it left open are
    closed now, not shown as running by a read made the instant after it died."""
    import time

    from .client import exiting, lock_holder
    deadline = time.monotonic() + EXITING_WAIT_S
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            pid = lock_holder(project)
            if (pid is not None and not exiting(pid)) or time.monotonic() > deadline:
                return False
            time.sleep(0.02)


def _said_disk_full(e) -> bool:
    """A full disk while repairing before a read: said once, and the read goes on."""
    import sys

    from ..journal import disk_full
    if not disk_full(e):
        return False
    print("envgit: the disk is full: steps left open are closed once there is room (free some "
          "space)", file=sys.stderr)
    return True
