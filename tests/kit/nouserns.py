"""A host that refuses unprivileged user namespaces, made for one command (notes/hosts.md): as
root, a child unshares a user namespace mapping host uids 0-65535 to themselves (files keep
their owners), sets `user.max_user_namespaces` to 0 inside it (the limit is per namespace), and
execs the command, as root or as a given uid. There, `bwrap --unshare-user` fails with "No space
left on device", exactly as on Ubuntu 24.04 or in Docker's default profile, and so does
everything the command starts (the session daemon included).

    subprocess.run(nouserns.wrap(["envgit", "run", "--", "id"], uid=1000))

Run as a script: `python nouserns.py [--uid N] -- ARGV…` (what wrap() returns).
"""

import os
import sys

HERE = os.path.abspath(__file__)


def wrap(argv, uid=None) -> list[str]:
    return [sys.executable, "-I", HERE, *(["--uid", str(uid)] if uid is not None else []), "--", *argv]


def available() -> bool:
    """Root, and a kernel that lets root unshare a user namespace."""
    return os.geteuid() == 0 and os.path.exists("/proc/self/ns/user") and hasattr(os, "unshare")


def _main(args):
    uid = None
    if args[:1] == ["--uid"]:
        uid, args = int(args[1]), args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        print("usage: nouserns.py [--uid N] -- ARGV…", file=sys.stderr)
        return 2
    argv = args[1:]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        try:
            os.unshare(os.CLONE_NEWUSER)
            os.write(ready_w, b"u")
            os.close(ready_w)
            if os.read(go_r, 1) != b"g":
                os._exit(125)
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0\n")
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            os.execvp(argv[0], argv)
        except OSError as e:
            print(f"nouserns: {e}", file=sys.stderr)
        os._exit(125)
    os.close(ready_w)
    os.close(go_r)
    if os.read(ready_r, 1) == b"u":
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write("0 0 65536\n")
        os.write(go_w, b"g")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
