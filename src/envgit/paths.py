"""Where a project's files are. Standard library only: used on the hot path."""

import os

POLICY_FILE = "envgit.yaml"
STATE_DIR = ".envgit"


class NoProject(Exception):
    pass


def inside(path: str, top: str) -> bool:
    """`path` is `top` or below it: plain string paths, absolute and normalised by the caller
    (nothing is resolved here; a caller that must see through symlinks resolves first)."""
    top = top.rstrip("/")
    return path == top or path.startswith(top + "/")


def external_state(root: str) -> str:
    """Where a project's state lives when `envgit init` put it outside the project: on a host
    whose steps run with Landlock (sandbox/backend.py), which cannot keep a directory inside
    the writable project from a step, `.envgit` is only a symlink to here, which no rule of a
    step's allows. Found from the project's path alone, never from the link (a step can
    replace the link; it cannot write here)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    import _sha2  # type: ignore[import-not-found]  # the builtin; hashlib would load OpenSSL on the hot path
    digest = _sha2.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(base, "envgit", "projects", f"{os.path.basename(root) or 'root'}-{digest}")


class Project:
    def __init__(self, root: str):
        self.root = root
        self._state: str | None = None

    @property
    def policy(self):
        return os.path.join(self.root, POLICY_FILE)

    @property
    def state(self):
        """The project's state directory: `.envgit` in it, or the one outside it that `envgit
        init` made on a Landlock host (external_state), which wins whenever it exists."""
        if self._state is None:
            ext = external_state(self.root)
            self._state = ext if os.path.isdir(ext) else os.path.join(self.root, STATE_DIR)
        return self._state

    @property
    def state_is_outside(self) -> bool:
        """The state is kept outside the project (external_state), `.envgit` only its link."""
        return self.state != os.path.join(self.root, STATE_DIR)

    def state_path(self, *parts):
        return os.path.join(self.state, *parts)

    @property
    def journal(self):
        return self.state_path("journal.sqlite")

    @property
    def socket(self):
        return self.state_path("daemon.sock")


class NestedProject(NoProject):
    """A project directory inside another project: refused (see find_project)."""


def _is_project(d: str) -> bool:
    try:
        if os.stat(os.path.join(d, POLICY_FILE)).st_mode & 0o170000 != 0o100000:   # a regular file
            return False
    except OSError:
        return False
    for state in (os.path.join(d, STATE_DIR), external_state(d)):   # in it, or kept outside it
        try:
            if os.stat(state).st_mode & 0o170000 == 0o040000:          # a directory
                return True
        except OSError:
            pass
    return False


def find_project(start: str | None = None) -> Project:
    """The envgit project `start` is in: the directory at or above it holding envgit.yaml and
    .envgit/, looked for all the way up to /.

    A project inside another project is refused, never used: a step can write anywhere in
    its project, so `sub/envgit.yaml` + `sub/.envgit/` may be a policy the step chose for
    itself (its secrets readable, its outer .git writable, nothing in the outer journal).
    Nothing under a project can therefore decide the policy of a later command; a person who
    meant to nest one removes it or moves it out (the error says which)."""
    d = os.path.realpath(start or os.getcwd())
    found = []
    while True:
        if _is_project(d):
            found.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    if not found:
        raise NoProject(f"no envgit project at or above {start or os.getcwd()}: "
                        "run `envgit init` in the project's root first")
    if len(found) > 1:
        outer, inner = found[-1], found[-2]
        raise NestedProject(
            f"{inner} holds an envgit project inside the project {outer}, which envgit does "
            f"not use: a step of {outer} can write there, so its policy may be one a step chose. "
            f"Remove {os.path.join(inner, POLICY_FILE)} and {os.path.join(inner, STATE_DIR)} "
            f"(envgit log in {outer} shows the step that made them, marked policy-file-written), "
            f"or move the project out of {outer}")
    return Project(found[0])


# sun_path holds 108 bytes; a deep project's socket paths do not fit.
_UNIX_PATH_MAX = 100


class UnixAddress:
    """A unix socket path usable in bind()/connect() however long it is: a long one is reached
    as /proc/self/fd/N/NAME through an open descriptor of its directory, closed on exit.

        with UnixAddress(path) as addr:
            sock.connect(addr)
    """

    def __init__(self, path: str):
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> str:
        if len(os.fsencode(self.path)) <= _UNIX_PATH_MAX:
            return self.path
        self.fd = os.open(os.path.dirname(self.path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        return f"/proc/self/fd/{self.fd}/{os.path.basename(self.path)}"

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
