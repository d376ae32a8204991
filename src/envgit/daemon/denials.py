"""A denial said where it happens: the daemon watches the placeholders that cover each running
sandbox's denied paths (sandbox/masks.py) with inotify (their directories: an open of a file
in one is reported with its name), and a step that opens one is told at
once, on its terminal (or its agent's tool result), once per path, and the step's end entry
records it (`denied_reads`).

Each running view has a set of placeholders of its own, so an open names the view, and with it
the step, that made it: the sets are kept in a pool and used again by later steps (a step
begins with no file written when the denied paths are the ones the last step had). The
inotify descriptor is read on the daemon's loop; a step's end reads what is pending first, so
an open a step made just before it exited is its own.
"""

import ctypes
import ctypes.util
import errno
import os
import struct

from ..inert import inert
from ..policy.globs import has_magic
from ..sandbox.masks import ALIAS_RULE, Masks, remove

IN_OPEN = 0x20
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")        # wd, mask, cookie, len
POOL_KEEP = 8                         # idle placeholder sets kept for later steps
POOL_FILES = 2048                     # a set holding more is removed at its step's end
WATCHED_DIRS = 256                    # denied directories' placeholders watched in one set


def read_notice(step, path: str, rule: str, where: str, root: str, home: str) -> str:
    """The one line a step's terminal is shown when it opened a denied path's placeholder
    (inert: the path is the step's choice)."""
    if path.startswith(root + "/"):
        shown = path[len(root) + 1:]
        if shown == "~" or shown.startswith("~/"):
            # a project directory named `~` (a step can make one): shown bare, the line would
            # read as the home's and advise an allow_read entry naming the home's own file
            shown = "./" + shown
    else:
        shown = "~" + path[len(home):] if home and path.startswith(home + "/") else path
    if rule == ALIAS_RULE:
        return inert(f"envgit: step {step}: {shown} is hidden from steps as another name (a link) "
                     f"of a file filesystem.deny_read hides; it reads as a one-line placeholder "
                     f"here, while it leads there (allow_read does not lift it: read the file "
                     f"by its own name, if the policy allows it)")
    if rule.startswith("credentials."):
        fix = "a credential's real value reaches requests through the gate, never a step"
    elif has_magic(shown):
        # allow_read reads `*`, `?`, `[` as a pattern: a directory a step named `**` would have
        # the advice lift the deny from every .env of the project
        fix = ("its name holds *, ? or [, which filesystem.allow_read reads as a pattern: "
               "to let steps read it, rename it and add the new name")
    else:
        # a name with no `/` in allow_read matches at every depth (`.env` would lift every
        # .env of the project): the entry offered names this one path
        entry = "./" + shown if path.startswith(root + "/") and "/" not in shown else shown
        fix = f"to let steps read it, add {entry!r} to filesystem.allow_read in envgit.yaml"
    return inert(f"envgit: step {step}: {shown} is hidden from steps by filesystem.deny_read "
                 f"'{rule}' ({where}); it reads as a one-line placeholder here: {fix}")


class DenialWatch:
    """`on_open(owner, path, rule, where)` is called for each placeholder opened; `owner` is
    what `take(owner)` was given (a step id, or a launch's own key)."""

    def __init__(self, state_dir: str, on_open):
        self.root = os.path.join(state_dir, "sandbox", "masks")
        self.on_open = on_open
        self.fd = -1
        self._wds: dict[int, tuple[Masks, str]] = {}       # wd -> (its set, a directory of it)
        self._watched: set[str] = set()
        self._idle: list[Masks] = []
        self._busy: dict[object, list[Masks]] = {}
        self._n = 0
        self._libc = None
        remove(self.root)                  # sets an earlier daemon left: no step uses them
        try:
            self._libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            self.fd = self._libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            self.fd = -1

    def take(self, owner) -> Masks:
        """A set of placeholders for a view `owner`'s sandbox binds (given back by `release`);
        an owner's second view (an agent's launch asked for again) shares its first one's."""
        if self._busy.get(owner):
            return self._busy[owner][0]
        masks = self._idle.pop() if self._idle else None
        if masks is None:
            self._n += 1
            masks = Masks(os.path.join(self.root, f"{os.getpid()}-{self._n}"))
        masks.owner = owner
        masks.begin()
        self._busy.setdefault(owner, []).append(masks)
        return masks

    def watch(self, masks: Masks) -> None:
        """Watch the directories of the placeholders the last view made in `masks`: the set's
        own, which holds every file placeholder, and each denied directory's the view binds
        (the first WATCHED_DIRS of them: each costs the person one of their inotify watches)."""
        if self.fd < 0 or self._libc is None:
            return
        wanted = [masks.directory] + [d for d in masks.dirs if d in masks.used][:WATCHED_DIRS]
        keep = set(wanted)      # an earlier view's directories: no watch spent on them
        for wd in [w for w, (m, at) in self._wds.items() if m is masks and at not in keep]:
            self._unwatch(wd)
        for at in wanted:
            if at in self._watched:
                continue
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(at), IN_OPEN)
            if wd >= 0:
                self._wds[wd] = (masks, at)
                self._watched.add(at)

    def _unwatch(self, wd: int) -> None:
        self._watched.discard(self._wds.pop(wd)[1])
        if self._libc is not None:
            self._libc.inotify_rm_watch(self.fd, wd)

    def drain(self) -> None:
        """Every open the kernel has queued, said now (called by the loop and at a step's end)."""
        if self.fd < 0:
            return
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                return
            if not data:
                return
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _, size = _EVENT.unpack_from(data, at)
                at += _EVENT.size + size
                if mask & IN_IGNORED:
                    gone = self._wds.pop(wd, None)
                    if gone:
                        self._watched.discard(gone[1])
                    continue
                hit = self._wds.get(wd)
                # a file of a watched directory, opened (its name follows the event)
                if hit and mask & IN_OPEN and not mask & IN_ISDIR and size and hit[0].owner is not None:
                    name = data[at - size:at].rstrip(b"\0")
                    path, rule, where = hit[0].covers.get(
                        os.path.join(hit[1], os.fsdecode(name)), ("", "", ""))
                    if path:
                        self.on_open(hit[0].owner, path, rule, where)

    def release(self, owner) -> None:
        """`owner`'s sandbox is gone: its placeholders wait for a later step (or are removed)."""
        self.drain()
        for masks in self._busy.pop(owner, []):
            masks.owner = None
            if len(self._idle) < POOL_KEEP and len(masks.covers) < POOL_FILES \
                    and len(masks.dirs) < WATCHED_DIRS:
                self._idle.append(masks)
            else:
                self._forget(masks)

    def _forget(self, masks: Masks) -> None:
        for wd in [w for w, (m, _) in self._wds.items() if m is masks]:
            self._unwatch(wd)
        remove(masks.directory)

    def close(self) -> None:
        for masks in self._idle + [m for ms in self._busy.values() for m in ms]:
            self._forget(masks)
        self._idle, self._busy = [], {}
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        remove(self.root)
