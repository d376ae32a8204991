"""A step plants a setuid/setgid file, deletes it, and waits for a rewind: run as root, the
rewind would write it back owned by root with its setuid bit, a root shell for anyone who can
run it. Restore never re-creates setuid or setgid bits (docs/FORMAT.md, "Tree"); the file
itself, its content and its other mode bits come back.

Oracle: the restored file's mode bits (a setuid-root binary is the marker of the attack)."""

import os
import stat

import pytest

pytestmark = pytest.mark.both_uids(
    "setuid and setgid bits: a rewind as root writes the file back owned by root (a root shell for "
    "anyone), as a user its own; neither may get the bits back")


def test_rewind_does_not_recreate_setuid_or_setgid_bits(attacker):
    a = attacker
    # A step can no longer set the bits (tests/adversarial/test_setuid.py), so they are put
    # there outside, before the first step: its snapshot holds them, as a snapshot could
    # from a machine without the seccomp filter.
    r = a.host("cp /usr/bin/id tool && mkdir shared && echo data > shared/f && chmod 6755 tool "
               "&& chmod 2775 shared")
    assert r.returncode == 0, r.stderr
    r = a.run("stat -c %a tool shared")
    assert r.returncode == 0, r.stderr
    planted = r.stdout.split()
    assert planted == ["6755", "2775"]                   # the bits were there when snapshotted
    assert a.run("rm -r tool shared").returncode == 0
    r = a.envgit("rewind", "1", "--yes")
    assert r.returncode == 0, r.stderr
    tool = os.stat(a.root / "tool")
    assert not tool.st_mode & (stat.S_ISUID | stat.S_ISGID), oct(tool.st_mode)
    shared = os.stat(a.root / "shared")
    assert not shared.st_mode & stat.S_ISGID, oct(shared.st_mode)
    # the legitimate part of the rewind: content and the other bits come back
    assert (a.root / "tool").read_bytes() == open("/usr/bin/id", "rb").read()
    assert stat.S_IMODE(tool.st_mode) == 0o755 and stat.S_IMODE(shared.st_mode) == 0o775
    assert (a.root / "shared" / "f").read_text() == "data\n"
    assert a.host("./tool -u").returncode == 0
