"""The organisation policy: one policy file outside every project, under which each project's
envgit.yaml is loaded. A project can tighten it, never loosen it.

Where it is: /etc/envgit/policy.yaml. Only when that file does not exist, $ENVGIT_ORG_POLICY
may name another (tests, a machine without root): the variable can add an organisation policy,
never replace or hide the one in /etc. Whichever it is, the file must be owned by root and not
writable by anyone else, nor may any directory above it (else whoever can write there can
rewrite the organisation's rules); it may not lie inside the project (a step can write there).
A file that is there but refused, unreadable or invalid is an error: every step is refused, the
policy is never quietly left out. Who reads the variable: the session daemon, from the
environment of the person's `envgit run` that started it (a step's environment never reaches
it: a step only asks the daemon over its socket), and `envgit policy`/`doctor`, run by the
person. A step may set the variable for its own processes; what they compute binds nothing.

Its trust is here: where the file is, and who may have written it. How the two combine is
orgmerge.py (`combine`, rule by rule, for every key of the format: docs/FORMAT.md
"Organisation policy" has the table).
"""

import os
import stat

from . import orgcopy
from .schema import PolicyError, where_line
from .writes import resolved_writes

ORG_POLICY_PATH = "/etc/envgit/policy.yaml"
ORG_POLICY_ENV = "ENVGIT_ORG_POLICY"


def locate(project_root: str | None = None, environ=None) -> str | None:
    """The organisation policy's path, or None when there is none. Raises PolicyError when one
    is named but cannot be trusted."""
    environ = os.environ if environ is None else environ
    path = ORG_POLICY_PATH
    if not os.path.lexists(path):
        named = environ.get(ORG_POLICY_ENV, "")
        if not named:
            return _from_bucket(project_root)
        path = named
        if not os.path.isabs(path):
            raise PolicyError(path, 0, 0, f"${ORG_POLICY_ENV} names {path!r}: the organisation "
                              "policy's path must be absolute")
        if not os.path.lexists(path):
            raise PolicyError(path, 0, 0, f"${ORG_POLICY_ENV} names this organisation policy, "
                              "which does not exist; create it or unset the variable")
    check_trust(path, project_root)
    return path


def _from_bucket(project_root):
    """The copy of a remote's organisation policy (orgcopy.py), when one is in use."""
    src = orgcopy.source()
    if src is None:
        return None
    path = orgcopy.copy_path()
    if not os.path.lexists(path):
        raise PolicyError(orgcopy.label(src), 0, 0, f"the organisation policy of remote "
                          f"{src['remote']} is not fetched; run `envgit remote set {src['remote']} "
                          f"--policy {src['object']}`")
    # the person's own copy: theirs or root's, and writable by no one else
    check_trust(path, project_root, owners=(0, os.getuid()))
    return path


def shown(path: str) -> str:
    """How the organisation policy at `path` is named to people: the bucket object's URL for a
    remote's copy, else the path."""
    if path == orgcopy.copy_path():
        src = orgcopy.source()
        if src is not None:
            return orgcopy.label(src)
    return path


def check_trust(path: str, project_root: str | None = None, owners=(0,)) -> None:
    """The file, and every directory on the way to it (symlinks followed), owned by root and
    writable by no one else: only root can have written the organisation's rules. (A remote's
    copy may also be the person's own: `owners`.)"""
    real = os.path.realpath(path)
    if project_root:
        root = os.path.realpath(project_root)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            raise PolicyError(path, 0, 0, "the organisation policy lies inside the project, "
                              "where a step can write; keep it in /etc/envgit")
    try:
        st = os.stat(real)
    except OSError as e:
        raise PolicyError(path, 0, 0, f"the organisation policy cannot be read ({e.strerror}); "
                          "every step is refused until it can") from None
    if not stat.S_ISREG(st.st_mode):
        raise PolicyError(path, 0, 0, "the organisation policy is not a regular file")
    _owned_by_root(path, real, st, "file", owners)
    d = os.path.dirname(real)
    while True:
        _owned_by_root(path, d, os.stat(d), "directory", owners)
        if d == "/":
            break
        d = os.path.dirname(d)


def _owned_by_root(path, what, st, kind, owners=(0,)):
    others = st.st_mode & 0o002 and not (kind == "directory" and st.st_mode & stat.S_ISVTX)
    group = st.st_mode & 0o020 and st.st_gid != 0
    if st.st_uid not in owners or others or group:
        who = f"owned by uid {st.st_uid}" if st.st_uid not in owners else \
            f"writable by {'everyone' if others else f'group {st.st_gid}'}"
        raise PolicyError(path, 0, 0, f"the organisation policy is refused: {kind} {what} is "
                          f"{who}; it must be owned by {'root' if owners == (0,) else 'root or you'} "
                          "and writable only by its owner (chown, chmod go-w), so that no one else "
                          "can change it")


def check_unwritable(data: dict, where: dict, org_path: str, home: str, project_root: str) -> None:
    """No allow_write entry (of either file) may make the organisation policy, or a directory
    above it, writable inside the sandbox: a step (as root) could then rewrite it. Entries are
    resolved as decide.resolve does (a relative one against the project: `../..` leaves it)."""
    real = os.path.realpath(org_path)
    for t, entry, key in resolved_writes(data, home, project_root):
        if real == t or real.startswith(t.rstrip("/") + "/"):
            f, n = where_line(where[key])
            raise PolicyError(f, n, 1, f"filesystem.allow_write makes {entry} writable, which "
                              f"holds the organisation policy {org_path}: a step could rewrite "
                              "it; remove it")


def stat_key(environ=None):
    """What changes when the organisation policy does (the daemon re-reads the policy then):
    the stat of the file /etc or $ENVGIT_ORG_POLICY names, after symlinks, or None."""
    environ = os.environ if environ is None else environ
    path = ORG_POLICY_PATH if os.path.lexists(ORG_POLICY_PATH) else environ.get(ORG_POLICY_ENV, "")
    if not path:
        path = orgcopy.copy_path()
    try:
        st = os.stat(path)
    except OSError:
        return (path, "missing")
    return (path, st.st_ino, st.st_mtime_ns, st.st_size, st.st_ctime_ns, st.st_mode, st.st_uid)
