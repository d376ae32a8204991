"""Where a project's files are. Standard library only: used on the hot path."""

import os

POLICY_FILE = "envgit.yaml"
STATE_DIR = ".envgit"


class NoProject(Exception):
    pass


class Project:
    def __init__(self, root: str):
        self.root = root

    @property
    def policy(self):
        return os.path.join(self.root, POLICY_FILE)

    @property
    def state(self):
        return os.path.join(self.root, STATE_DIR)

    def state_path(self, *parts):
        return os.path.join(self.root, STATE_DIR, *parts)

    @property
    def journal(self):
        return self.state_path("journal.sqlite")

    @property
    def socket(self):
        return self.state_path("daemon.sock")


def find_project(start: str | None = None) -> Project:
    """The nearest directory at or above `start` holding envgit.yaml and .envgit/."""
    d = os.path.realpath(start or os.getcwd())
    while True:
        if os.path.isfile(os.path.join(d, POLICY_FILE)) and os.path.isdir(os.path.join(d, STATE_DIR)):
            return Project(d)
        parent = os.path.dirname(d)
        if parent == d:
            raise NoProject(f"no envgit project at or above {start or os.getcwd()}: "
                            "run `envgit init` in the project's root first")
        d = parent


# sun_path holds 108 bytes; a deep project's socket paths do not fit.
_UNIX_PATH_MAX = 100


class UnixAddress:
    """A unix socket path usable in bind()/connect() however long it is: a long one is reached
    as /proc/self/fd/N/NAME through an open descriptor of its directory, closed on exit.

        with UnixAddress(path) as addr:
            sock.connect(addr)
    """

    def __init__(self, path: str):
        self.path, self.fd = path, None

    def __enter__(self) -> str:
        if len(os.fsencode(self.path)) <= _UNIX_PATH_MAX:
            return self.path
        self.fd = os.open(os.path.dirname(self.path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self.fd}/{os.path.basename(self.path)}"

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
