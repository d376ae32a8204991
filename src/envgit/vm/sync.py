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
not let a step write (protect entries: envgit.yaml, ...). A refused write-back is said.
"""

import json
import os
import stat

from ..policy.decide import decide_resolved, resolve
from . import wire
from .wire import CHUNK

SKIP_NAMES = {".envgit", ".git"}


def _entry(st):
    if stat.S_ISDIR(st.st_mode):
        return ("dir", 0, 0, stat.S_IMODE(st.st_mode))
    if stat.S_ISLNK(st.st_mode):
        return ("link", 0, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    if stat.S_ISREG(st.st_mode):
        return ("file", st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    return None


class View:
    """Which project paths the guest may see and write, by the policy's rules."""

    def __init__(self, pol, root, masked=()):
        self.root = root
        self.rules = resolve(pol, root, os.path.expanduser("~"))
        self.masked = [m for m in masked if m == root or m.startswith(root + "/")]

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
        return not self.hidden(rel) and decide_resolved(self.rules, self._abs(rel)).access == "write"


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
                    off = 0
                    while True:
                        data = os.read(fd, CHUNK)
                        last = len(data) < CHUNK
                        link.send(wire.PUT, json.dumps({**h, "op": "file", "offset": off, "last": last}).encode()
                                  + b"\n" + data, ch)
                        off += len(data)
                        sent += len(data)
                        if last:
                            break
                finally:
                    os.close(fd)
    finally:
        link.release(ch)
    link.call(wire.SYNCED, b"{}", timeout=300)      # after every PUT above: the agent is done
    return now, sent


def collect(link, root, view: View, manifest: dict) -> tuple[dict, list[str], int]:
    """Write onto the host what the step changed in the guest; returns the new manifest, the
    paths refused (not writable by the policy) and the bytes written."""
    refused, written = [], [0]

    def apply(kind, payload):
        head, _, data = payload.partition(b"\n")
        h = json.loads(head)
        rel, op = h["path"], h["op"]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            return
        if not view.writable(rel):
            if rel not in refused and not view.hidden(rel):
                refused.append(rel)
            return
        p = os.path.join(root, rel)
        if _through_link(root, rel):
            refused.append(rel)
            return
        if op == "rm":
            _remove(p)
            for k in [k for k in manifest if k == rel or k.startswith(rel + "/")]:
                manifest.pop(k, None)
            return
        if op == "dir":
            if not (os.path.isdir(p) and not os.path.islink(p)):
                _remove(p)
                os.makedirs(p, exist_ok=True)
            os.chmod(p, h["mode"] & 0o7777 & ~0o6000)
        elif op == "link":
            _remove(p)
            os.symlink(h["target"], p)
        elif op == "file":
            if h.get("offset", 0) == 0:
                if os.path.isdir(p) and not os.path.islink(p):
                    _remove(p)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            else:
                fd = os.open(p, os.O_WRONLY | os.O_NOFOLLOW)
                os.lseek(fd, h["offset"], os.SEEK_SET)
            try:
                wire.write_all(fd, data)
                written[0] += len(data)
            finally:
                os.close(fd)
            os.chmod(p, h["mode"] & 0o7777 & ~0o6000)     # no setuid bits from a guest
        if h.get("last", True):
            try:
                manifest[rel] = _entry(os.lstat(p))
            except OSError:
                pass

    link.call(wire.COLLECT, b"{}", timeout=600, on_frame=apply)
    return manifest, refused, written[0]


def _through_link(root, rel) -> bool:
    """Whether a parent of `rel` on the host is a symlink (a write there would land elsewhere)."""
    parts = rel.split("/")[:-1]
    p = root
    for part in parts:
        p = os.path.join(p, part)
        if os.path.islink(p):
            return True
    return False


def _remove(p):
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        for name in os.listdir(p):
            _remove(os.path.join(p, name))
        os.rmdir(p)
    else:
        os.unlink(p)
