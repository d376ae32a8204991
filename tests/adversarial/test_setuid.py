"""A step plants a setuid (or setgid) program in the project: run as root, `cp /bin/bash rootsh
&& chmod 4755 rootsh` leaves on the host disk a shell any user runs as euid 0 (bwrap's nosuid
mounts hold only inside the sandbox). The seccomp filter refuses every call that would set
either bit (sandbox/seccomp.py); the daemon strips any that reach a step's changed files anyway
and marks the step (daemon/special_bits.py).

Oracle: the mode bits on disk outside, after the step (and that ordinary modes still apply)."""

import io
import os
import stat
import tarfile

import pytest

pytestmark = pytest.mark.both_uids(
    "setuid and setgid: a root step is uid 0 with its capabilities dropped, a non-root user's step is "
    "in a user namespace (where chmod is checked against the uid map); a planted setuid file must be "
    "refused, or stripped and marked, for both")

SPECIAL = stat.S_ISUID | stat.S_ISGID


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.mark.parametrize("how", [
    "cp /bin/sh f && chmod 4755 f",
    "cp /bin/sh f && chmod u+s f",
    "cp /bin/sh f && chmod g+s f",
    "cp /bin/sh f && chmod 6755 f",
    "install -m 4755 /bin/sh f",
    "cp -p /usr/bin/passwd f",
    "python3 -c 'import os; os.close(os.open(\"f\", os.O_CREAT | os.O_WRONLY, 0o4755))'",
    "python3 -c 'import os; fd = os.open(\".\", os.O_TMPFILE | os.O_WRONLY, 0o4755); "
    "os.link(f\"/proc/self/fd/{fd}\", \"f\", follow_symlinks=True)'",
    "python3 -c 'import os; os.mknod(\"f\", 0o104755)'",
    "python3 -c 'import os; fd = os.open(\"f\", os.O_CREAT | os.O_WRONLY, 0o755); os.fchmod(fd, 0o4755)'",
    "tar -xpf evil.tar",
])
def test_a_step_cannot_set_setuid_or_setgid(attacker, how):
    a = attacker
    if "passwd" in how and not os.stat("/usr/bin/passwd").st_mode & stat.S_ISUID:
        pytest.skip("no setuid /usr/bin/passwd on this machine to copy")
    if "tar" in how:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            data = b"#!/bin/sh\nid\n"
            info = tarfile.TarInfo("f")
            info.size, info.mode = len(data), 0o6755
            t.addfile(info, io.BytesIO(data))
        (a.root / "evil.tar").write_bytes(buf.getvalue())
        a.own(a.root / "evil.tar")
    r = a.run(how + "; stat -c %a f")
    f = a.root / "f"
    # (where the refused call is the one that creates, there is no file at all)
    assert not (f.exists() and _mode(f) & SPECIAL), (oct(_mode(f)), r.stdout, r.stderr)
    assert "setuid-stripped" not in r.stderr      # refused in the step, nothing left to strip


def test_ordinary_modes_still_apply(attacker):
    a = attacker
    r = a.run("cp /bin/sh tool && chmod 755 tool && echo x > data && chmod 644 data "
              "&& install -m 750 /bin/true t2 && mkdir -m 700 d && chmod +t d "
              "&& python3 -c 'import os; os.close(os.open(\"p\", os.O_CREAT | os.O_WRONLY, 0o640))' "
              "&& tar -cf t.tar data && mkdir x && tar -xpf t.tar -C x && ./tool -c 'echo RAN'")
    assert r.returncode == 0, r.stderr
    assert "RAN" in r.stdout
    assert _mode(a.root / "tool") == 0o755 and _mode(a.root / "data") == 0o644
    assert _mode(a.root / "t2") == 0o750 and _mode(a.root / "d") == 0o1700
    assert _mode(a.root / "p") == 0o640 and _mode(a.root / "x" / "data") == 0o644


def test_the_refusal_says_operation_not_permitted(attacker):
    r = attacker.run("cp /bin/sh f && chmod 4755 f")
    assert r.returncode != 0
    assert "Operation not permitted" in r.stderr
    assert _mode(attacker.root / "f") == 0o755


def test_a_setuid_file_among_a_steps_changes_is_stripped_and_marked(attacker):
    """Defence in depth: a bit that reached the project some other way (here put there outside
    any step, between two) is removed after the step whose snapshot first sees it."""
    a = attacker
    assert a.run("true").returncode == 0          # the baseline: before the file is there
    planted = a.root / "planted"
    planted.write_bytes(open("/bin/sh", "rb").read())
    os.chmod(planted, 0o4755)
    a.own(planted)
    os.chmod(planted, 0o4755)                      # (chown cleared it)
    assert _mode(planted) == 0o4755
    r = a.run("true")
    assert r.returncode == 0, r.stderr
    assert _mode(planted) == 0o755                 # the rest of the mode kept
    assert "setuid-stripped" in r.stderr and "planted" in r.stderr
    log = a.envgit("log")
    assert "setuid-stripped" in log.stdout, log.stdout


def test_stripping_a_hard_link_leaves_the_file_it_shares_alone(attacker, tmp_path):
    """A setuid file hard-linked into the project (a root step can link one of root's own):
    the daemon gives the project's name a copy without the bits; the other name keeps them."""
    a = attacker
    assert a.run("true").returncode == 0
    other = a.root.parent / "elsewhere-setuid"
    other.write_bytes(b"#!/bin/sh\necho ran\n")
    a.own(other)
    os.chmod(other, 0o4755)
    os.link(other, a.root / "linked")
    r = a.run("true")
    assert r.returncode == 0, r.stderr
    assert _mode(other) == 0o4755                         # the other name: untouched
    assert _mode(a.root / "linked") == 0o755
    assert os.stat(a.root / "linked").st_ino != os.stat(other).st_ino
    assert (a.root / "linked").read_bytes() == other.read_bytes()
    assert "setuid-stripped" in r.stderr
