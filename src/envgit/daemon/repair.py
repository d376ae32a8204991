"""Finding steps whose `envgit run` or daemon died (SIGKILL, power loss) and closing them as
`interrupted`: never lost, never left half-written. Standard library only."""

import fcntl
import os


def mark_interrupted(journal, reason) -> list[int]:
    """Close every open step. Call only as the journal's single writer: the daemon at start,
    or a command holding the daemon lock (so no daemon is running)."""
    done = []
    for s in journal.open_steps():
        journal.append(s.id, "interrupted", {"reason": reason})
        done.append(s.id)
    return done


def repair_if_no_daemon(project) -> list[int]:
    """What the CLI calls before reading: if no daemon holds the lock, close orphaned steps."""
    from ..journal import Journal
    if not os.path.exists(project.journal):
        return []
    with open(project.state_path("daemon.lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return []                   # a daemon is running: it owns the journal
        j = Journal(project.journal)
        try:
            if not j.open_steps():
                return []
            return mark_interrupted(j, "no session daemon was running; the step's envgit run died")
        finally:
            j.close()
