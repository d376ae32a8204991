"""The person's approvals of what a project's policy makes the host read, run or connect to
(policy/hostentries.py: every credential, with the hosts its value is sent to; every MCP
server, a command or a url), like direnv's `allow`: a project entry is used only when the
hash of its exact text (`digest`) is recorded here for that project. A changed text is
another hash, so it is asked about again.

Where: $XDG_STATE_HOME/envgit/trust/<sha256 of the project's real path>.json (default
~/.local/state/envgit/…), the person's own state: outside every project, and outside what a
step sees (the sandbox's home is an empty read-only tmpfs with only allow_read toolchains in
it, sandbox/view.py). A policy whose allow_write would make that place writable in a step
is refused here rather than trusted: a step could write its own approvals. The file is 0600 in
a 0700 directory, written whole or not at all (atomicfile); one that is not the person's, or
that others can write, approves nothing.

The organisation's entries are the organisation's (its file is root's): never asked
about. Everything here runs in the daemon, `envgit mcp`, `envgit doctor` and `envgit trust`,
never on `envgit run`'s hot path.
"""

import hashlib
import json
import os
import stat
import time

from ..atomicfile import write_atomic
from ..policy.hostentries import describe, label
from .writable import project_root, step_writable


class Untrusted(Exception):
    """A project entry (credential, MCP server) the person has not approved (or cannot safely approve here);
    str() is one line naming envgit.yaml, its line and the fix."""


def state_dir(environ=None) -> str:
    environ = os.environ if environ is None else environ
    root = environ.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(root):
        home = environ.get("HOME") or os.path.expanduser("~")
        root = os.path.join(home, ".local", "state")
    return os.path.join(os.path.normpath(root), "envgit", "trust")


def store_path(root: str, environ=None) -> str:
    key = hashlib.sha256(os.path.realpath(root).encode("utf-8", "surrogateescape")).hexdigest()
    return os.path.join(state_dir(environ), key[:32] + ".json")


def check_place(policy, environ=None) -> str:
    """The approvals file for this policy's project, or Untrusted when a step could write it
    (inside the project, or under an allow_write of the policy)."""
    path = store_path(project_root(policy), environ)
    if step_writable(policy, path, environ or os.environ):
        raise Untrusted(f"{policy.path}: credentials and MCP servers cannot be trusted: the approvals "
                            f"file {path} is writable by steps of this project (inside it, or "
                            "under filesystem.allow_write); set XDG_STATE_HOME to a place "
                            "outside, or remove that allow_write")
    return path


def approvals(root: str, environ=None) -> dict[str, dict]:
    """digest -> what was approved, for the project at `root`."""
    path = store_path(root, environ)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        # a file someone else owns or can write is not the person's approval
        if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not stat.S_ISREG(st.st_mode):
            return {}
        with os.fdopen(fd, encoding="utf-8") as f:
            fd = -1
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    finally:
        if fd >= 0:
            os.close(fd)
    if not isinstance(doc, dict) or doc.get("root") != os.path.realpath(root):
        return {}
    got = doc.get("approved")
    return got if isinstance(got, dict) else {}


def project_entries(policy) -> list[dict]:
    return [e for e in policy.host_entries if not e["org"]]


def untrusted(policy, environ=None) -> list[dict]:
    have = approvals(project_root(policy), environ)
    return [e for e in project_entries(policy) if e["digest"] not in have]


def approve(policy, environ=None) -> list[dict]:
    """Record every entry the project's policy names now as approved (and only those:
    an approval of a text the policy no longer holds is dropped). Returns them."""
    path = check_place(policy, environ)
    root = project_root(policy)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    entries = project_entries(policy)
    doc = {"root": root, "version": 2, "approved": {e["digest"]: {
        "what": label(e), "where": e["where"], "text": e["text"], "does": describe(e),
        "approves": e["approves"], "approved_at": now} for e in entries}}
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    write_atomic(path, json.dumps(doc, indent=1, sort_keys=True) + "\n", 0o600, chmod=0o600)
    return entries


def revoke(root: str, environ=None) -> int:
    """Forget every approval for the project at `root`; how many there were."""
    n = len(approvals(root, environ))
    try:
        os.unlink(store_path(root, environ))
    except FileNotFoundError:
        pass
    return n


def message(entry: dict) -> str:
    return (f"{entry['where']}: {label(entry)} {describe(entry)}: not trusted (new, or changed "
            "since you did); review it with `envgit trust`")


def check(policy, entry: dict, environ=None) -> None:
    """Raise Untrusted unless `entry` (one of policy.host_entries) may be used now."""
    if entry["org"]:
        return                                  # the organisation's, trusted as such
    check_place(policy, environ)
    if entry["digest"] not in approvals(project_root(policy), environ):
        raise Untrusted(message(entry))


def find(policy, kind: str, name: str) -> dict | None:
    return next((e for e in policy.host_entries if e["kind"] == kind and e["name"] == name), None)


def require(policy, kind: str, name: str, approves: dict, environ=None) -> dict:
    """The entry `kind` `name` of the loaded policy, if it is exactly `approves` (what is about
    to be read, run or connected to) and trusted; else Untrusted, one line naming envgit.yaml,
    its line and the fix."""
    entry = find(policy, kind, name)
    if entry is None or entry["approves"] != approves:
        raise Untrusted(f"{policy.path}: {kind} {name}: not as the loaded policy names it; "
                        "review it with `envgit trust`")
    check(policy, entry, environ)
    return entry
