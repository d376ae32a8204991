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
           Found by a scan (`find`, ~0.5 s on /etc /usr /opt) in a background thread, shared by
           the daemons of this machine through a root-only cache in /run/envgit and redone
           every REFRESH_S in the background (a step waits only when no recent scan exists):
           a root-only file made on the host after a scan is visible until the next one.

Why not run a root's steps as an unprivileged host uid instead: bwrap maps the sandbox's uid
only to the caller's own, and a user namespace made beforehand (bwrap --userns) mapping it to
another host uid would make the root-owned project read-only to the step and every file it
writes owned by that uid, not as the person expects. Only an id-mapped mount of every writable
path would reconcile the two, and bwrap cannot make or take one. The mask gives a root step
what an ordinary user sees instead.

A masked path is covered by an empty mode-000 file or directory: opening it fails with
"Permission denied", as it does for any other user.
"""

import os
import stat
import subprocess
import threading
import time

from ..policy.decide import SYSTEM_DIRS

# runc's and Docker's lists (moby oci/defaults.go), kept for what the rules below do not cover
# by themselves: entries any user may read that list keys, leak timing or act on devices.
PROC_READONLY = ("sys", "sysrq-trigger", "irq", "bus", "fs")
PROC_MASKED = ("kcore", "keys", "key-users", "timer_list", "timer_stats", "sched_debug",
               "latency_stats", "acpi", "scsi", "asound")
SYS_MASKED = ("/sys/firmware", "/sys/devices/virtual/powercap", "/sys/fs/selinux")

# How old a scan may be before it is redone (ENVGIT_ROOT_SCAN_MAX_AGE, seconds, in the daemon's
# environment: 0 scans afresh for every daemon and after every step, for a person who adds
# root-only files while sessions run).
def _max_age():
    try:
        return max(0.0, float(os.environ.get("ENVGIT_ROOT_SCAN_MAX_AGE", "300")))
    except ValueError:
        return 0.0                             # unreadable: scan afresh (deny on doubt)


REFRESH_S = _max_age()
CACHE_DIR = "/run/envgit"
CACHE_FILE = CACHE_DIR + "/root-only-paths"

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
        for p in ROOT_ONLY.paths():
            if any(_inside(p, k) or _inside(k, p) for k in keep) or any(_inside(a, p) for a in allowed) \
                    or any(_inside(p, c) for c in covered):
                continue
            try:
                is_dir = stat.S_ISDIR(os.lstat(p).st_mode)
            except OSError:
                continue                       # gone since the scan: nothing to hide
            mask(p, is_dir)
            masked.append(p)
    return args, masked


def _inside(p, d):
    return p == d or p.startswith(d.rstrip("/") + "/")


def _sentinels(state_dir):
    """The empty mode-000 file and directory that cover masked paths."""
    d = os.path.join(state_dir, "sandbox")
    f, dd = os.path.join(d, "kernel-hidden"), os.path.join(d, "kernel-hidden-dir")
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


class RootOnlyScan:
    """The paths of the system view that only root can read, kept fresh off the hot path."""

    def __init__(self):
        self._paths = None
        self._at = 0.0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._running = False

    def warm(self):
        """Start a scan now unless a recent one is at hand (the daemon calls this at start)."""
        if os.geteuid() == 0:
            self._refresh(wait=False)

    def paths(self) -> list[str]:
        self._refresh(wait=True)
        return self._paths or []

    def _refresh(self, wait):
        with self._lock:
            if self._paths is None:
                cached = _read_cache()
                if cached is not None:
                    self._at, self._paths = cached
                    self._done.set()
            stale = time.time() - self._at > REFRESH_S
            if stale and not self._running:
                self._running = True
                threading.Thread(target=self._scan, daemon=True, name="root-only-scan").start()
        if wait and self._paths is None:
            self._done.wait()                  # no scan yet: the first step waits (deny on doubt)

    def _scan(self):
        at = time.time()
        try:
            paths = scan_root_only(_roots())
            with self._lock:
                self._paths, self._at = paths, at
            _write_cache(at, paths)
        finally:
            with self._lock:
                self._running = False
                if self._paths is None:
                    self._paths = []           # the scan failed outright: said in daemon.log
            self._done.set()


ROOT_ONLY = RootOnlyScan()


def _roots():
    out = []
    for name in SYSTEM_DIRS:
        p = "/" + name
        if os.path.isdir(p) and not os.path.islink(p):
            out.append(p)
    return out


def scan_root_only(roots: list[str]) -> list[str]:
    """Every file others cannot read and every directory others cannot list or enter, not
    descending into the latter. `find` does it in ~0.5 s where a Python walk takes ~2.5 s."""
    if not roots:
        return []
    expr = ["(", "-type", "d", "(", "!", "-perm", "-o=r", "-o", "!", "-perm", "-o=x", ")", "-prune",
            "-print0", ")", "-o", "(", "!", "-type", "d", "!", "-type", "l", "!", "-perm", "-o=r",
            "-print0", ")"]
    # find from the system's own directories, never from PATH: a step can plant a `find` in a
    # project virtualenv that PATH may name, and this runs outside the sandbox, as root.
    find = next((f for f in ("/usr/bin/find", "/bin/find") if os.access(f, os.X_OK)), None)
    if find is None:
        return _walk(roots)
    try:
        r = subprocess.run([find, *roots, *expr], capture_output=True, timeout=600, env={"LC_ALL": "C"})
        return sorted(os.fsdecode(p) for p in r.stdout.split(b"\0") if p)
    except (OSError, subprocess.SubprocessError):
        return _walk(roots)


def _walk(roots):
    out, stack = [], list(roots)
    while stack:
        d = stack.pop()
        try:
            it = os.scandir(d)
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    m = e.stat(follow_symlinks=False).st_mode
                except OSError:
                    continue
                if stat.S_ISLNK(m):
                    continue
                if stat.S_ISDIR(m):
                    (out.append if m & 0o005 != 0o005 else stack.append)(e.path)
                elif not m & 0o004:
                    out.append(e.path)
    return sorted(out)


def _read_cache():
    """(scanned at, paths) from the machine's cache, if root wrote it and nobody else can."""
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
        at = float(data[0])
    except (ValueError, IndexError):
        return None
    if not 0 <= time.time() - at <= REFRESH_S:
        return None
    return at, [os.fsdecode(p) for p in data[1:] if p]


def _write_cache(at, paths):
    try:
        os.makedirs(CACHE_DIR, mode=0o700, exist_ok=True)
        st = os.lstat(CACHE_DIR)
        if st.st_uid != 0 or not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o022:
            return
        tmp = f"{CACHE_FILE}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(b"\0".join([repr(at).encode(), *(os.fsencode(p) for p in paths)]))
        os.replace(tmp, CACHE_FILE)
    except OSError:
        pass
