"""The project's copy in the guest, kept in step with the host's directory by the daemon.

Why a copy and not a shared directory: QEMU refuses to migrate (so to snapshot) a guest with a
virtio-9p export mounted ("Migration is disabled when VirtFS export path is mounted"), and the
Debian cloud kernel has no 9p anyway. So the guest holds the project in its own RAM (where a
memory snapshot captures it together with the processes using it), and around each step the
daemon pushes what changed on the host in (`push`) and takes what the step changed out
(`collect`), through the agent's port.

What the guest never gets, under the same view rules as the default tier: envgit's state
(.envgit), every path the policy denies reading (the step's masked paths, deny_read globs, the
content denies such as private keys), git's directories (no git in the guest; their config and
hooks are escape routes). What is never written back: the same, and every path the policy does
not let a step write (protect entries: envgit.yaml, ...), nor anything inside the paths the
default tier binds read-only for a step (sandbox/view.py's `protected`, passed in: the
`core.hooksPath` directory, the files a git config includes, agents' settings...). A refused
write-back is said.

The write-back only ever touches a host path the guest HAD (synced in, so in the manifest) and
finds unchanged since (size, mtime, mode, inode as recorded): a removal is never recursive (the
agent sends one per path, deepest first), a directory goes only once nothing is left in it, and
a file the person edited on the host while the step ran keeps the person's edit. Whatever is
left is said on the step, and taken out of the manifest so that the next push gives the guest
the host's version again.
"""

import json
import os
import stat

from ..paths import inside as _inside
from ..policy.decide import decide_resolved, resolve
from . import wire

SKIP_NAMES = {".envgit", ".git"}


def _entry(st):
    """What a host path was when synced: the inode too, so that a file replaced on the host
    (an editor's save by rename) reads as changed even with the same size and mtime."""
    if stat.S_ISDIR(st.st_mode):
        return ("dir", 0, 0, stat.S_IMODE(st.st_mode), st.st_ino)
    if stat.S_ISLNK(st.st_mode):
        return ("link", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_ino)
    if stat.S_ISREG(st.st_mode):
        return ("file", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), st.st_ino)
    return None


def _now(p):
    try:
        return _entry(os.lstat(p))
    except OSError:
        return None


class View:
    """Which project paths the guest may see and write, by the policy's rules."""

    def __init__(self, pol, root, masked=(), protected=()):
        """`masked`: the step's deny masks; `protected`: the paths the default tier's view binds
        read-only for the same step (sandbox/view.py), the one list of them."""
        self.root = root
        self.rules = resolve(pol, root, os.path.expanduser("~"))
        self.masked = [m for m in masked if m == root or m.startswith(root + "/")]
        real = os.path.realpath(root)
        self.protected = [p for p in protected if _inside(p, root) or _inside(p, real)]

    def _abs(self, rel):
        return os.path.join(self.root, rel)

    def hidden(self, rel) -> bool:
        if any(part in SKIP_NAMES for part in rel.split("/")):
            return True
        p = self._abs(rel)
        if any(p == m or p.startswith(m + "/") for m in self.masked):
            return True
        return decide_resolved(self.rules, p).access == "none"

    def writable(self, rel) -> bool:
        if self.hidden(rel):
            return False
        p = self._abs(rel)
        if self.protected:
            # the path and where it really is (a symlinked parent on the host)
            where = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
            if any(_inside(p, q) or _inside(where, q) for q in self.protected):
                return False
        return decide_resolved(self.rules, p).access == "write"


def scan(root, view: View) -> dict:
    out = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            names = os.listdir(os.path.join(root, rel) if rel else root)
        except OSError:
            continue
        for name in names:
            r = f"{rel}/{name}" if rel else name
            if view.hidden(r):
                continue
            try:
                e = _entry(os.lstat(os.path.join(root, r)))
            except OSError:
                continue
            if e is None:
                continue
            out[r] = e
            if e[0] == "dir":
                stack.append(r)
    return out


def push(link, root, view: View, manifest: dict) -> tuple[dict, int]:
    """Send the guest what changed on the host since `manifest` (as last synced); returns the
    new manifest and the bytes sent."""
    now = scan(root, view)
    sent = 0
    ch = link.channel()
    try:
        gone = sorted(set(manifest) - set(now), reverse=True)
        for rel in gone:
            if not any(rel.startswith(g + "/") for g in gone if g != rel):
                link.send(wire.PUT, json.dumps({"path": rel, "op": "rm"}).encode() + b"\n", ch)
        for rel in sorted(now):
            e = now[rel]
            if manifest.get(rel) == e:
                continue
            p = os.path.join(root, rel)
            h = {"path": rel, "mode": e[3]}
            if e[0] == "dir":
                link.send(wire.PUT, json.dumps({**h, "op": "dir"}).encode() + b"\n", ch)
            elif e[0] == "link":
                link.send(wire.PUT, json.dumps({**h, "op": "link", "target": os.readlink(p)}).encode() + b"\n", ch)
            else:
                try:
                    fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
                except OSError:
                    now.pop(rel, None)
                    continue
                try:
                    for off, data, last, size in wire.file_pieces(fd):      # sparse: data only
                        link.send(wire.PUT, json.dumps({**h, "op": "file", "offset": off, "last": last,
                                                        "size": size}).encode() + b"\n" + data, ch)
                        sent += len(data)
                finally:
                    os.close(fd)
    finally:
        link.release(ch)
    link.call(wire.SYNCED, b"{}", timeout=300)      # after every PUT above: the agent is done
    return now, sent


def collect(link, root, view: View, manifest: dict) -> tuple[dict, dict, int]:
    """Write onto the host what the step changed in the guest; returns the new manifest, what
    was not written ({"refused": not writable by the policy, "kept": directories that still
    hold what the guest never had, "edited": host paths the person changed during the step})
    and the bytes written."""
    left: dict[str, list[str]] = {"refused": [], "kept": [], "edited": []}
    skip = set()                    # a file's later chunks, once its first was not written
    written = [0]

    def leave(why, rel):
        if rel not in left[why]:
            left[why].append(rel)
        skip.add(rel)
        manifest.pop(rel, None)     # the next push gives the guest the host's version

    def apply(kind, payload):
        head, _, data = payload.partition(b"\n")
        h = json.loads(head)
        rel, op = h["path"], h["op"]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            return
        first = op != "file" or h.get("offset", 0) == 0
        if not first and rel in skip:
            return
        skip.discard(rel)
        if not view.writable(rel):
            if not view.hidden(rel):
                leave("refused", rel)
            return
        p = os.path.join(root, rel)
        if _through_link(root, rel):
            leave("refused", rel)
            return
        if first and _now(p) != manifest.get(rel):
            leave("edited", rel)    # not what was synced in: the person's edit wins
            return
        if op == "rm":
            if not _remove_one(p):
                leave("kept", rel)
                return
            manifest.pop(rel, None)
            return
        if op == "dir":
            if not (os.path.isdir(p) and not os.path.islink(p)):
                _remove_one(p)
                os.makedirs(p, exist_ok=True)
            os.chmod(p, h["mode"] & 0o7777 & ~0o6000)
        elif op == "link":
            if not _remove_one(p):
                leave("kept", rel)
                return
            os.symlink(h["target"], p)
        elif op == "file":
            if first:
                if not _remove_one(p, files=False):
                    leave("kept", rel)
                    return
                os.makedirs(os.path.dirname(p), exist_ok=True)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            else:
                fd = os.open(p, os.O_WRONLY | os.O_NOFOLLOW)
            try:
                # at its offset: what the guest sent no data for stays a hole on the host
                wire.write_piece(fd, h.get("offset", 0), data, h.get("size") if h.get("last", True) else None)
                written[0] += len(data)
            finally:
                os.close(fd)
            os.chmod(p, h["mode"] & 0o7777 & ~0o6000)     # no setuid bits from a guest
        if h.get("last", True):
            e = _now(p)
            if e is not None:
                manifest[rel] = e

    link.call(wire.COLLECT, b"{}", timeout=600, on_frame=apply)
    return manifest, left, written[0]


def _through_link(root, rel) -> bool:
    """Whether a parent of `rel` on the host is a symlink (a write there would land elsewhere)."""
    parts = rel.split("/")[:-1]
    p = root
    for part in parts:
        p = os.path.join(p, part)
        if os.path.islink(p):
            return True
    return False


def _remove_one(p, files=True) -> bool:
    """Remove `p` itself, never what is in it: a directory only when empty (what the guest
    removed inside it came first, one path at a time; what is left the guest never had, or may
    not touch). `files=False`: leave a file alone (it is about to be rewritten in place).
    Whether `p` is gone (or, files=False, is no directory any more)."""
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return True
    if stat.S_ISDIR(st.st_mode):
        try:
            os.rmdir(p)
        except OSError:
            return False
    elif files:
        os.unlink(p)
    return True
