"""An unprivileged user made for one test, removed after it (with every process it left)."""

import contextlib
import os
import shutil
import subprocess
import uuid

from kit.locks import machine_lock


def can_make_users() -> bool:
    return os.geteuid() == 0 and shutil.which("useradd") is not None


@contextlib.contextmanager
def test_user(prefix: str = "envgit-t"):
    """Yields the new user's name. useradd/userdel hold /etc/passwd's lock and fail at once
    when another has it, so tests running side by side take turns through a machine lock."""
    name = prefix + uuid.uuid4().hex[:6]
    with machine_lock("passwd"):
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        with machine_lock("passwd"):
            subprocess.run(["userdel", name], capture_output=True)


test_user.__test__ = False      # not a test, whatever pytest's name rules say
