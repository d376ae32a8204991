"""An optional change watcher for a long-lived process: inotify on every directory, via ctypes.

A snapshot given a watcher re-checks only the names that had events, in the directories that
had them (and their ancestors' entries for the changed subtrees); every other directory reuses
its cached tree, and an unchanged child of a changed directory its cached entry. When
the watcher cannot say exactly what changed (at start, after the kernel queue overflowed, after
a directory was moved, on an event for an unknown watch) it asks for a full walk instead.

Not seen by inotify: writes through a shared mmap, changes through another mount of the same
files. (With root, fanotify with a filesystem mark would need one mark instead of a watch per
directory: a later optimisation.)
"""

import ctypes
import errno
import os
import struct

from .capture import ALL
from .filter import Filter

IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x40, 0x80, 0x100, 0x200
IN_DELETE_SELF, IN_MOVE_SELF, IN_UNMOUNT = 0x400, 0x800, 0x2000
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000
IN_ONLYDIR, IN_DONT_FOLLOW, IN_EXCL_UNLINK, IN_ISDIR = 0x01000000, 0x02000000, 0x04000000, 0x40000000
_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
         | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
_EVENT = struct.Struct("iIII")     # wd, mask, cookie, len; then len bytes of NUL-padded name

_libc = ctypes.CDLL(None, use_errno=True)


class WatcherError(OSError):
    pass


class ChangeWatcher:
    def __init__(self, root, flt: Filter | None = None):
        self.root = os.fsencode(os.fspath(root))
        self.flt = flt or Filter()
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise WatcherError(ctypes.get_errno(), "inotify_init1: " + os.strerror(ctypes.get_errno()))
        self.paths: dict[int, bytes] = {}   # watch descriptor -> directory relpath
        self.dirty: dict[bytes, set[bytes] | str] = {}   # directory relpath -> child names with events, or ALL
        self.full = True                    # the first snapshot walks everything

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def changes(self) -> dict | None:
        """Drain the events. None means "walk everything"; otherwise {directory relpath: the
        names (bytes) in it that had events, or ALL (list the whole directory)}. Ancestors are
        not included (the capture adds them)."""
        self._drain()
        if self.full:
            self.full = False
            self.paths.clear()
            self._watch_tree(b"")
            self._drain_discarding()   # events from before the new watches: the full walk sees them
            self.dirty = {}
            return None
        out, self.dirty = self.dirty, {}
        return out

    def _mark(self, rel: bytes, name: bytes) -> None:
        names = self.dirty.get(rel)
        if names is None:
            self.dirty[rel] = {name}
        elif isinstance(names, set):      # not ALL (the only str it holds)
            names.add(name)

    # -- watches --------------------------------------------------------------------------
    def _watch_tree(self, rel: bytes) -> None:
        """Watch `rel` and every directory under it (not following symlinks), marking them dirty."""
        stack = [rel]
        while stack:
            rel = stack.pop()
            path = os.path.join(self.root, rel) if rel else self.root
            wd = _libc.inotify_add_watch(self.fd, path, _MASK)
            if wd < 0:
                err = ctypes.get_errno()
                if err in (errno.ENOENT, errno.ENOTDIR):
                    continue            # gone already: its parent's event covers it
                if err == errno.ENOSPC:
                    raise WatcherError(err, "out of inotify watches (raise fs.inotify.max_user_watches)")
                raise WatcherError(err, f"inotify_add_watch {os.fsdecode(path)}: {os.strerror(err)}")
            self.paths[wd] = rel
            self.dirty[rel] = ALL
            try:
                with os.scandir(path) as it:
                    for e in it:
                        if e.is_dir(follow_symlinks=False):
                            sub = rel + b"/" + e.name if rel else e.name
                            if not self.flt.excluded(sub):
                                stack.append(sub)
            except (FileNotFoundError, NotADirectoryError):
                pass

    # -- events ---------------------------------------------------------------------------
    def _read(self) -> bytes:
        try:
            return os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return b""

    def _drain_discarding(self) -> None:
        while self._read():
            pass

    def _drain(self) -> None:
        while True:
            buf = self._read()
            if not buf:
                return
            pos = 0
            while pos < len(buf):
                wd, mask, _cookie, n = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size:pos + _EVENT.size + n].rstrip(b"\0")
                pos += _EVENT.size + n
                self._event(wd, mask, name)

    def _event(self, wd: int, mask: int, name: bytes) -> None:
        if mask & IN_Q_OVERFLOW:
            self.full = True
            return
        rel = self.paths.get(wd)
        if rel is None:
            if not mask & IN_IGNORED:      # an event we cannot place: be safe
                self.full = True
            return
        if mask & IN_IGNORED:              # the directory is gone (its parent saw IN_DELETE)
            del self.paths[wd]
            return
        if mask & (IN_MOVE_SELF | IN_UNMOUNT):
            self.full = True               # every path under it changed: rebuild the map
            return
        if mask & IN_DELETE_SELF:
            return
        if mask & IN_ISDIR and mask & (IN_MOVED_FROM | IN_MOVED_TO):
            self.full = True
            return
        if not name:                       # the directory itself (e.g. chmod): its entry in the parent
            if rel:
                parent, _, base = rel.rpartition(b"/")
                self._mark(parent, base)
            return
        self._mark(rel, name)
        child = rel + b"/" + name if rel else name
        if mask & IN_ISDIR and mask & IN_CREATE and not self.flt.excluded(child):
            self._watch_tree(child)
