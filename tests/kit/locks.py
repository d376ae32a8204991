"""Machine-wide locks for what tests running side by side (pytest-xdist workers, or two runs
on one machine) must not do at once: /etc/passwd edits (useradd fails with "cannot lock
/etc/passwd" when another holds it), shared caches being filled."""

import contextlib
import fcntl
import os

LOCKS = "/tmp/envgit-test-locks"


@contextlib.contextmanager
def machine_lock(name: str):
    os.makedirs(LOCKS, mode=0o1777, exist_ok=True)
    with open(os.path.join(LOCKS, name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
