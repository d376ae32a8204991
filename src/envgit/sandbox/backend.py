"""Which sandbox a step runs in on this host: bubblewrap's namespaces, or, where the host refuses
unprivileged user namespaces (Ubuntu 24.04's AppArmor restriction, Docker's default seccomp
profile, `user.max_user_namespaces = 0`), Landlock + seccomp (landlock_run.py), which is weaker
in ways every step records (WEAKER). Decided once per daemon, by trying bwrap itself.
"""

import os
import subprocess

BWRAP, LANDLOCK = "bwrap", "landlock"
MIN_LANDLOCK_ABI = 4        # TCP port rules: without them a step's TCP would be the host's own

# What a step under Landlock does not get that a step under bubblewrap does, in the words the
# step's record, `envgit show` and `envgit doctor` use (docs/THREATS.md has the why of each).
WEAKER = (
    "other processes of the host are visible in /proc (their command lines, not their "
    "environments or memory)",
    "a path the policy hides is unreadable rather than shown as a placeholder or absent: a "
    "program can still see that it exists (stat), and a directory holding hidden entries can "
    "still be listed",
    "inside a writable tree nothing can be hidden or kept read-only: the project's own denied "
    "files (.env), envgit.yaml and git's hooks and config are readable and writable while the "
    "step runs (the escape routes it writes are taken back after it; `envgit init` on such a "
    "host keeps the project's state outside the project, behind a link restored after each step)",
    "no unix sockets (socket(AF_UNIX) is refused: a path's socket cannot be judged), no UDP",
    "a step that opens a hidden path is not told why at once (no placeholder to watch)",
    "a step can watch a hidden directory with inotify and learn the names of entries used in "
    "it (never their contents)",
    "the kernel's files in /proc that bubblewrap hides (keys, timer_list, kpage*…) are readable",
    "no new terminal (no /dev/pts: script, expect and tmux cannot make one inside a step)",
    "/tmp is not the step's own: TMPDIR names the step's directory, and a program that writes "
    "to /tmp by name is refused",
)

_chosen: list = []


def current() -> str:
    """BWRAP or LANDLOCK for this host; raises RuntimeError (worded for the person) when
    neither can run."""
    if not _chosen:
        _chosen.append(_choose())
    if isinstance(_chosen[0], RuntimeError):
        raise _chosen[0]
    return _chosen[0]


def _choose():
    from .launch import LaunchError, bwrap_path
    try:
        bwrap = bwrap_path()
    except LaunchError as e:
        bwrap, said = None, str(e)
    if bwrap:
        try:
            r = subprocess.run([bwrap, "--unshare-user", "--unshare-pid", "--unshare-net", "--ro-bind", "/", "/",
                                "true"], capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                return BWRAP
            said = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        except (OSError, subprocess.TimeoutExpired) as e:
            said = str(e)
    if not _userns_refused(said):
        # bwrap is broken, not refused by the host (a wrong ENVGIT_BWRAP, a missing library):
        # its own failure stands, each step fails with it (exit 125) rather than run weaker
        return BWRAP
    from .landlock import abi
    version = abi()
    if version >= MIN_LANDLOCK_ABI:
        return LANDLOCK
    return RuntimeError(f"steps cannot be sandboxed on this host: bwrap cannot make namespaces "
                        f"({said}) and the kernel's Landlock ABI is {version} (4 or later is needed: "
                        "Linux 6.7+). Run `envgit doctor` for the fix.")


# What is weaker of the network, for a step without network.allow and for one with it.
OFFLINE = ("no network, and no TCP connection or listening socket at all, not even on "
           "127.0.0.1 (a dev server in a step cannot be reached, even by the step)")
GATED = ("the gate is reached by its TCP port on 127.0.0.1, not through a network namespace: "
         "Landlock allows that port number on any address, the gate knows the step by its "
         "proxy password alone, no other TCP connection or listening socket is allowed (not even "
         "on 127.0.0.1), and git over SSH and loopback entries of network.allow are not available")


def _userns_refused(said) -> bool:
    """The host refuses user namespaces (what the Landlock backend is for), as told by
    util-linux's `unshare -Ur`, which makes one and maps its uid as bwrap does (Ubuntu's
    AppArmor lets the unshare through and refuses the map); without it, by bwrap's words."""
    for unshare in ("/usr/bin/unshare", "/bin/unshare"):
        if os.path.isfile(unshare):
            try:
                return subprocess.run([unshare, "-Ur", "true"], capture_output=True, timeout=30).returncode != 0
            except (OSError, subprocess.TimeoutExpired):
                break
    return any(w in said for w in ("namespace", "uid map", "Operation not permitted"))


# Where landlock_meta.py cannot judge them (not x86-64): chmod, utimensat and setxattr as
# Landlock leaves them, which is not at all.
METADATA = ("the modes, times and extended attributes of any file the step's uid owns can be "
            "changed, outside the project too (Landlock has no right for them, and this machine's "
            "system calls are not judged by envgit's launcher): as root, those of every root-owned "
            "file of the host")


def weaker(gated: bool = False) -> list[str]:
    from .landlock_meta import supported
    return [*WEAKER, *(() if supported() else (METADATA,)), GATED if gated else OFFLINE]


def record(gated: bool = False) -> dict | None:
    """What a step's begin entry says of its sandbox: nothing under bubblewrap (the default),
    else the backend and what is weaker (`gated`: the step has network.allow)."""
    if current() == BWRAP:
        return None
    return {"backend": LANDLOCK, "weaker": weaker(gated)}


def host_is_landlock() -> bool:
    try:
        return current() == LANDLOCK
    except RuntimeError:
        return False
