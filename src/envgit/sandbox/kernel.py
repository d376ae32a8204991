"""What of the host a step must neither change nor read through the kernel's own files: /proc,
/sys, and, for a step run as root, the host files only root can read. The one place for it.

A step run by root is uid 0 mapped to host uid 0 (bwrap cannot map it to anyone else), with
every capability dropped. Capabilities do not guard everything: sysctl writes are checked by
uid (`/proc/sys/kernel/core_pattern` → a crash runs a program as root on the host), and the
owner bits of root's files let uid 0 read them. So, by rule rather than by list of known files:

  /proc    everything but the per-process directories is read-only: every top-level directory
           holding a file with a write bit (sys always, irq, bus, pressure, …) and every
           top-level file with one (mtrr, …); as root, every top-level entry others cannot
           read (kcore, kmsg, timer_list, slabinfo, sysrq-trigger, …) is masked, and so, for
           everyone, are runc's and Docker's masked paths that others may read but that leak
           or act on the host (PROC_MASKED).
  /sys     absent from the view (not in SYSTEM_DIRS); if a policy brings part of it in, that
           part is read-only and /sys/firmware (SYS_MASKED) masked. The same for any policy
           bind under /proc.
  as root  every file and directory of the read-only system view (SYSTEM_DIRS) that others
           cannot read (a file without o+r, a directory without o+r or o+x) is masked: a root
           step reads what any user could (/etc/ssl/private, pg_hba.conf, /etc/shadow, …).
           Current at every step's start (RootOnlyScan): the hand-edited trees (/etc, /opt,
           /usr/local) are watched with inotify, so a step re-checks only what changed since
           the last (~20 µs when nothing did); the package-managed rest (/usr, …) is scanned
           with `find` (~0.5 s) in a background thread, shared by the daemons of this machine
           through a root-only cache in /run/envgit, and rescanned before the next step
           whenever the package database changed (an install), else every REFRESH_S.

Why not run a root's steps as an unprivileged host uid instead: bwrap maps the sandbox's uid
only to the caller's own, and a user namespace made beforehand (bwrap --userns) mapping it to
another host uid would make the root-owned project read-only to the step and every file it
writes owned by that uid, not as the person expects. Only an id-mapped mount of every writable
path would reconcile the two, and bwrap cannot make or take one. The mask gives a root step
what an ordinary user sees instead.

A masked path is covered by an empty mode-000 file or directory: opening it fails with
"Permission denied", as it does for any other user.
"""

import errno
import os
import stat
import struct
import subprocess
import threading
import time

from ..paths import inside as _inside
from ..policy.decide import SYSTEM_DIRS
from .launch import cover_paths

# runc's and Docker's lists (moby oci/defaults.go), kept for what the rules below do not cover
# by themselves: entries any user may read that list keys, leak timing or act on devices.
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED = ("kcore", "keys", "key-users", "timer_list", "timer_stats", "sched_debug",
               "latency_stats", "acpi", "scsi", "asound")
SYS_MASKED = ("/sys/firmware", "/sys/devices/virtual/powercap", "/sys/fs/selinux")

# How old a scan of the package-managed trees may be before it is redone in the background
# (ENVGIT_ROOT_SCAN_MAX_AGE, seconds, in the daemon's environment: 0 scans afresh for every
# daemon and after every step, for a person who changes modes by hand under /usr).
def _max_age():
    try:
        return max(0.0, float(os.environ.get("ENVGIT_ROOT_SCAN_MAX_AGE", "300")))
    except ValueError:
        return 0.0                             # unreadable: scan afresh (deny on doubt)


REFRESH_S = _max_age()
YOUNG_S = 0.2          # a root-only path this new is masked only if it still exists this much later
CACHE_DIR = "/run/envgit"
CACHE_FILE = CACHE_DIR + "/root-only-paths-2"    # (2: with the package stamp)

_BINDS = ("--bind", "--bind-try", "--ro-bind", "--ro-bind-try", "--dev-bind", "--dev-bind-try")


def without_host_proc(view_args: list[str]) -> list[str]:
    """The view without any bind of the host's /proc (a policy's allow_read of /proc or a
    path in it): the step has its own, and the host's shows the host's processes (their
    environments, roots, fds) whatever the pid namespace. Nothing in it is the step's to need."""
    out, i = [], 0
    while i < len(view_args):
        a = view_args[i]
        if a in _BINDS and i + 2 < len(view_args) and _inside(view_args[i + 2], "/proc"):
            i += 3
            continue
        out.append(a)
        i += 1
    return out


def mounts(view_args: list[str], state_dir: str, keep: list[str], allowed: list[str],
           covered: list[str]) -> tuple[list[str], list[str]]:
    """bwrap arguments to append after the view (they must come after its `--proc /proc`), and
    the host paths they mask. `keep`: the project and the writable paths (never masked, nor
    anything that would hide them); `allowed`: paths the policy shows on purpose (a root-only
    path at or above one of them stays visible: the person named it); `covered`: paths the
    view already masks (a deny), not masked twice."""
    hidden_file, hidden_dir = _sentinels(state_dir)
    args, masked = [], []

    def mask(p, is_dir):
        args.extend(["--ro-bind", hidden_dir if is_dir else hidden_file, p])

    readonly, masks = _proc_plan()
    for p in readonly:
        args += ["--ro-bind", p, p]
    for p, is_dir in masks:
        mask(p, is_dir)

    # Whatever the policy itself bound under /proc or /sys stays read-only, /sys/firmware masked.
    dests = [view_args[i + 2] for i, a in enumerate(view_args[:-2]) if a in _BINDS]
    for d in dests:
        if _inside(d, "/proc") or _inside(d, "/sys"):
            args += ["--remount-ro", d]
    targets = {t for m in SYS_MASKED for d in dests
               for t in ([m] if _inside(m, d) else [d] if _inside(d, m) else [])}
    for t in sorted(targets):
        if os.path.exists(t):
            mask(t, os.path.isdir(t))

    if os.geteuid() == 0:
        young = []
        for p in ROOT_ONLY.paths():
            if any(_inside(p, k) or _inside(k, p) for k in keep) or any(_inside(a, p) for a in allowed) \
                    or any(_inside(p, c) for c in covered):
                continue
            try:
                st = os.lstat(p)
            except OSError:
                continue                       # gone since the scan: nothing to hide
            if time.time() - st.st_ctime < YOUNG_S:
                young.append(p)
                continue
            mask(p, stat.S_ISDIR(st.st_mode))
            masked.append(p)
        if young:
            # A lock or temporary file (useradd's /etc/group.lock, sed -i's) may be gone by the
            # time bwrap mounts over it, and bwrap cannot create the missing mount point in the
            # read-only /etc: the step would fail to start. Let such a file live YOUNG_S first.
            time.sleep(YOUNG_S)
            for p in young:
                try:
                    mask(p, stat.S_ISDIR(os.lstat(p).st_mode))
                    masked.append(p)
                except OSError:
                    pass
    return args, masked


def _sentinels(state_dir):
    """The empty mode-000 file and directory that cover masked paths."""
    f, dd = cover_paths(state_dir)        # their names: launch.py's (its second start looks for them)
    if not (os.path.isfile(f) and os.path.isdir(dd)):
        os.makedirs(dd, exist_ok=True)
        open(f, "a").close()
    for p in (f, dd):
        if stat.S_IMODE(os.stat(p).st_mode):
            os.chmod(p, 0)
    return f, dd


_PROC_PLAN = (0.0, None)


def _proc_plan():
    """(paths to bind read-only, (path, is_dir) to mask) in /proc: the same kernel for every
    step, so worked out once per daemon and again every REFRESH_S (a module loaded meanwhile
    may add entries). The host's /proc has the same global entries as the step's fresh one;
    the read-only binds take the host's, which show the reader's own namespaces (net, uts,
    ipc) as the step's own would. Each bind costs the step ~0.15 ms, so a directory is bound
    only when something in it has a write bit (or cannot be listed: deny on doubt)."""
    global _PROC_PLAN
    at, plan = _PROC_PLAN
    if plan is not None and time.monotonic() - at < REFRESH_S:
        return plan
    root = os.geteuid() == 0
    readonly, masks = [], []
    try:
        names = sorted(os.listdir("/proc"))
    except OSError:
        names = []
    for name in names:
        if name.isdigit() or name in ("self", "thread-self"):
            continue                           # the step's own processes
        p = "/proc/" + name
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue                           # /proc/mounts, /proc/net → self/…
        is_dir = stat.S_ISDIR(st.st_mode)
        if name in PROC_MASKED or (root and not st.st_mode & 0o004):
            masks.append((p, is_dir))          # (not readable by others: a user cannot read it anyway)
        elif name in PROC_READONLY or (_holds_writable(p) if is_dir else st.st_mode & 0o222):
            readonly.append(p)
    plan = (readonly, masks)
    _PROC_PLAN = (time.monotonic(), plan)
    return plan


def _holds_writable(d):
    """Whether a file under `d` has a write bit, or part of `d` cannot be listed (deny on doubt)."""
    stack = [d]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            return True
        for e in entries:
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError:
                return True
            if stat.S_ISDIR(mode):
                stack.append(e.path)
            elif not stat.S_ISLNK(mode) and mode & 0o222:
                return True
    return False


# The trees of the view a person edits by hand: watched (inotify), so a root-only file made in
# them is masked from the next step on. The rest of the view (/usr, /snap, /nix) changes with
# the package manager: rescanned when its database changes (PACKAGE_DBS), and every REFRESH_S.
ADMIN_TREES = ("/etc", "/opt", "/usr/local")
PACKAGE_DBS = ("/var/lib/dpkg/status", "/var/lib/dpkg/info", "/var/lib/rpm", "/usr/lib/sysimage/rpm",
               "/var/lib/pacman/local", "/lib/apk/db/installed", "/nix/var/nix/db", "/var/lib/snapd/state.json")


class RootOnlyScan:
    """The paths of the system view that only root can read, current at every step's start.

    Two parts. The admin trees (ADMIN_TREES) are walked once per daemon with an inotify watch on
    every directory others can enter; each step first reads the events queued since (a new
    name, a chmod, a rename) and re-checks only those paths: a few µs when nothing changed.
    The package-managed rest is scanned with find (~0.5 s), shared by the daemons of this
    machine through a root-only cache in /run/envgit; a step uses it while the package
    databases' stamps (PACKAGE_DBS) are those of the scan, and waits for a rescan when they
    are not (an install or upgrade); it is also redone in the background every REFRESH_S, for a
    hand-made change there. Deny on doubt: a queue overflow or a failed watch rescans."""

    def __init__(self):
        self._paths = None                    # package-managed part
        self._stamp = None
        self._at = 0.0
        self._admin = None
        self._admin_lock = threading.Lock()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._running = False

    def warm(self):
        """Start a scan now unless a recent one is at hand (the daemon calls this at start)."""
        if os.geteuid() == 0:
            self._refresh(wait=False)
            threading.Thread(target=self._admin_paths, daemon=True, name="root-only-watch").start()

    def paths(self) -> list[str]:
        self._refresh(wait=True)
        return sorted({*(self._paths or []), *self._admin_paths()})

    def _admin_paths(self):
        with self._admin_lock:
            if self._admin is None:
                self._admin = AdminTrees([t for t in ADMIN_TREES if os.path.isdir(t) and not os.path.islink(t)])
            return self._admin.current()

    def _refresh(self, wait):
        stamp = package_stamp()
        with self._lock:
            if self._paths is None:
                cached = _read_cache()
                if cached is not None and cached[1] == stamp:
                    self._at, self._stamp, self._paths = cached
                    self._done.set()
            changed = self._paths is not None and self._stamp != stamp
            if changed:                        # packages installed since: the old list is no answer
                self._paths = None
                self._done.clear()
            stale = changed or self._paths is None or time.time() - self._at > REFRESH_S
            if stale and not self._running:
                self._running = True
                threading.Thread(target=self._scan, daemon=True, name="root-only-scan").start()
        if wait and self._paths is None:
            self._done.wait()                  # no current scan: the step waits (deny on doubt)

    def _scan(self):
        at, stamp = time.time(), package_stamp()
        try:
            paths = scan_root_only(_roots(), prune=ADMIN_TREES)
            with self._lock:
                self._paths, self._at, self._stamp = paths, at, stamp
            _write_cache(at, stamp, paths)
        finally:
            with self._lock:
                self._running = False
                if self._paths is None:
                    self._paths = []           # the scan failed outright: said in daemon.log
            self._done.set()


ROOT_ONLY = RootOnlyScan()


# shadow-utils' lock files (useradd, passwd, chpasswd…: <db>.lock, <db>.<pid>, .pwd.lock): they
# hold a process id, and come and go within milliseconds, so one may vanish between the mask's
# list and bwrap's mount, and bwrap then fails the step (it cannot create the mount point in the
# read-only /etc). Left unmasked: nothing in them to read.
_LOCK_DBS = ("passwd", "group", "shadow", "gshadow", "subuid", "subgid")


def _lock_file(path) -> bool:
    d, name = os.path.split(path)
    if d != "/etc":
        return False
    base, _, ext = name.rpartition(".")
    return name == ".pwd.lock" or (base in _LOCK_DBS and (ext == "lock" or ext.isdigit()))


def package_stamp() -> str:
    """The package databases' change times: what moves when packages are installed."""
    out = []
    for p in PACKAGE_DBS:
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append(f"{p}={st.st_mtime_ns}.{st.st_ctime_ns}.{st.st_ino}")
    return ";".join(out)


class AdminTrees:
    """The root-only paths under `roots`, kept current by an inotify watch on every directory
    others can list and enter: an event (a name created, moved in, its mode changed) has the
    path re-checked, and a new or newly readable directory walked and watched. Without inotify
    (or out of watches) every call rescans the trees (~0.1 s): slower, never stale."""

    _MASK = 0x4 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x01000000 | 0x02000000 | 0x04000000
    #       ATTRIB MOVED_FROM MOVED_TO CREATE DELETE DELETE_SELF MOVE_SELF ONLYDIR DONT_FOLLOW EXCL_UNLINK
    _Q_OVERFLOW, _IGNORED = 0x4000, 0x8000

    def __init__(self, roots):
        self.roots = roots
        self.fd = -1
        self.paths = set()
        self.dirs = {}                         # watch descriptor -> directory
        try:
            import ctypes
            self._libc = ctypes.CDLL(None, use_errno=True)
            self._errno = ctypes.get_errno
            self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        except (OSError, AttributeError):
            self.fd = -1
        self._rebuild()

    def _rebuild(self):
        self.paths, self.dirs = set(), {}
        if self.fd < 0:
            return
        try:
            self._drain()                      # what came before the new walk: it sees it all
        except OSError:
            pass
        for r in self.roots:
            if not self._walk(r):
                os.close(self.fd)              # out of watches: rescan every time instead
                self.fd = -1
                print("envgit daemon: cannot watch the system's directories (inotify: out of "
                      "watches); root-only files are looked for at every step", flush=True)
                return

    def current(self) -> set:
        if self.fd < 0:
            return {p for p in scan_root_only(self.roots) if not _lock_file(p)}
        try:
            events = self._drain()
        except OSError:
            events = None
        if events is None:                     # overflowed: the queue lost events
            self._rebuild()
            return self.current() if self.fd < 0 else set(self.paths)
        for path in events:
            self._recheck(path)
        return set(self.paths)

    def _drain(self):
        """The paths named by queued events; None after a queue overflow."""
        out, overflow = [], False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            i = 0
            while i + 16 <= len(data):
                wd, mask, _cookie, n = struct.unpack_from("iIII", data, i)
                name = data[i + 16:i + 16 + n].rstrip(b"\0")
                i += 16 + n
                if mask & self._Q_OVERFLOW:
                    overflow = True
                    continue
                d = self.dirs.get(wd)
                if mask & self._IGNORED:
                    self.dirs.pop(wd, None)
                if d is not None:
                    out.append(os.path.join(d, os.fsdecode(name)) if name else d)
        return None if overflow else out

    def _recheck(self, path):
        self.paths = {p for p in self.paths if not _inside(p, path)}
        try:
            m = os.lstat(path).st_mode
        except OSError:
            return
        if stat.S_ISLNK(m):
            return
        if stat.S_ISDIR(m):
            if m & 0o005 != 0o005:
                self.paths.add(path)
            elif not self._walk(path):
                self._rebuild()
        elif not m & 0o004 and not _lock_file(path):
            self.paths.add(path)

    def _walk(self, top) -> bool:
        """Watch `top` and every directory under it others can enter, each before it is listed
        (what appears while it is listed has an event); note what others cannot read."""
        try:
            m = os.lstat(top).st_mode
        except OSError:
            return True
        if m & 0o005 != 0o005:
            self.paths.add(top)
            return True
        stack = [top]
        while stack:
            d = stack.pop()
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), self._MASK)
            if wd < 0:
                if self._errno() == errno.ENOSPC:
                    return False
                continue                       # gone meanwhile
            self.dirs[wd] = d
            for path, enter in _classify(d):
                if enter:
                    stack.append(path)
                elif not _lock_file(path):
                    self.paths.add(path)
        return True


def _roots():
    out = []
    for name in SYSTEM_DIRS:
        p = "/" + name
        if os.path.isdir(p) and not os.path.islink(p) and p not in ADMIN_TREES:
            out.append(p)
    return out


def scan_root_only(roots: list[str], prune=()) -> list[str]:
    """Every file others cannot read and every directory others cannot list or enter, not
    descending into the latter (nor into `prune`). `find` does it in ~0.5 s where a Python walk
    takes ~2.5 s."""
    if not roots:
        return []
    skip = []
    for p in prune:
        skip += ["-path", p, "-prune", "-o"]
    expr = [*skip, "(", "-type", "d", "(", "!", "-perm", "-o=r", "-o", "!", "-perm", "-o=x", ")", "-prune",
            "-print0", ")", "-o", "(", "!", "-type", "d", "!", "-type", "l", "!", "-perm", "-o=r",
            "-print0", ")"]
    # find from the system's own directories, never from PATH (the one resolver every host
    # binary goes through): a step can plant a `find` in a project virtualenv that PATH may
    # name, and this runs outside the sandbox, as root.
    from .launch import LaunchError, trusted_binary
    try:
        find = trusted_binary("find")
    except LaunchError:
        return [p for p in _walk(roots) if not any(_inside(p, x) for x in prune)]
    try:
        r = subprocess.run([find, *roots, *expr], capture_output=True, timeout=600, env={"LC_ALL": "C"})
        return sorted(os.fsdecode(p) for p in r.stdout.split(b"\0") if p)
    except (OSError, subprocess.SubprocessError):
        return [p for p in _walk(roots) if not any(_inside(p, x) for x in prune)]


def _walk(roots):
    out, stack = [], list(roots)
    while stack:
        for path, enter in _classify(stack.pop()):
            (stack.append if enter else out.append)(path)
    return sorted(out)


def _classify(d):
    """(path, enter) for each entry of directory `d` that matters to the root-only scan: a
    directory others can list and enter (enter=True: look inside), or a file others cannot
    read or a directory they cannot list or enter (enter=False: mask it whole). Symlinks and
    entries gone meanwhile are skipped. The one loop behind the fallback walk and the watcher."""
    try:
        it = os.scandir(d)
    except OSError:
        return
    with it:
        for e in it:
            try:
                m = e.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(m):
                continue
            if stat.S_ISDIR(m):
                yield e.path, m & 0o005 == 0o005
            elif not m & 0o004:
                yield e.path, False


def _read_cache():
    """(scanned at, package stamp, paths) from the machine's cache, if root wrote it and nobody
    else can."""
    try:
        fd = os.open(CACHE_FILE, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != 0 or st.st_mode & 0o022:
            return None
        data = f.read().split(b"\0")
    try:
        at, stamp = float(data[0]), "" if data[1] == b"-" else os.fsdecode(data[1])
    except (ValueError, IndexError):
        return None
    if not 0 <= time.time() - at <= REFRESH_S:
        return None
    return at, stamp, [os.fsdecode(p) for p in data[2:] if p]


def _write_cache(at, stamp, paths):
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        st = os.lstat(CACHE_DIR)
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022:
            return
        tmp = f"{CACHE_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0".join([repr(at).encode(), os.fsencode(stamp) or b"-",
                                 *(os.fsencode(p) for p in paths)]))
        os.replace(tmp, CACHE_FILE)
    except OSError:
        pass
