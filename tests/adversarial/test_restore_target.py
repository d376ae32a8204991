"""`envgit restore N --target DIR` writes what a step left in its snapshot, on the host, as the
person (often root). A step chooses every name and symlink in that snapshot, so it would like
the restore to write outside DIR: a symlink `x -> /etc` (or `x -> ../..`) in one step, a
directory `x/` holding `file` in the next, restored one over the other; a path asked for
through a symlink of the snapshot (`-- x/file`); a target named through a symlink the step
planted in the project (`--target proj/out`, `out -> ~/somewhere`).

Oracle: a marker file outside the target (in /etc, in a directory beside it, at the place the
planted symlink names) that a followed symlink would create."""

import os
import uuid

import pytest

pytestmark = pytest.mark.both_uids(
    "restore writes on the host as the person: root may write anywhere (/etc) and sets owners, a "
    "non-root user only where DAC lets it: the refusals to follow a link must hold for both")


def place(a, name):
    """A directory outside the project, writable by the attacker's user (so that only envgit's
    refusal to follow a link keeps a marker out of it)."""
    d = a.home.parent / f"{name}-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    a.own(d)
    return d


def test_a_symlink_to_etc_then_a_directory_of_that_name(attacker):
    a = attacker
    marker = f"envgit-restore-marker-{uuid.uuid4().hex[:8]}"
    try:
        assert a.run("ln -s /etc x").returncode == 0                                  # step 1
        assert a.run(f"rm x && mkdir x && echo pwned > x/{marker}").returncode == 0    # step 2
        target = place(a, "target") / "t"
        a.envgit("restore", "1", "--target", str(target), check=True)
        assert os.readlink(target / "x") == "/etc"                # the snapshot's symlink, as it was
        r = a.envgit("restore", "2", "--target", str(target), "--force")
        assert not os.path.lexists(f"/etc/{marker}")
        assert r.returncode == 0, r.stderr
        assert not os.path.islink(target / "x") and (target / "x" / marker).read_text() == "pwned\n"
        # the other way round: the symlink over the directory is refused (a directory in the
        # way is never removed), nothing written
        r = a.envgit("restore", "1", "--target", str(target), "--force")
        assert r.returncode == 2 and "a directory where the snapshot has a file" in r.stderr
        assert not os.path.lexists(f"/etc/{marker}")
    finally:
        if os.path.lexists(f"/etc/{marker}"):
            os.unlink(f"/etc/{marker}")


def test_a_relative_symlink_up_then_a_directory_of_that_name(attacker):
    a = attacker
    top = place(a, "top")
    (top / "a" / "b").mkdir(parents=True)
    a.own(top)
    target = top / "a" / "b" / "t"                 # t/x -> ../.. is `top/a`
    assert a.run("ln -s ../.. x && ln -s ../../../.. y").returncode == 0                 # step 1
    assert a.run("rm x y && mkdir -p x y/deep && echo pwned > x/file && echo pwned > y/deep/file "
                 "&& ln -s ../../.. y/deep/z").returncode == 0                            # step 2
    assert a.run("rm -r y/deep/file && mkdir y/deep/z.d && echo pwned > y/deep/z.d/f").returncode == 0
    a.envgit("restore", "1", "--target", str(target), check=True)
    r = a.envgit("restore", "2", "--target", str(target), "--force")
    assert r.returncode == 0, r.stderr
    r = a.envgit("restore", "1", "--target", str(target), "--force")     # the links over the dirs
    assert r.returncode == 2 and "a directory where the snapshot has a file" in r.stderr
    r = a.envgit("restore", "3", "--target", str(target), "--force")
    assert r.returncode == 0, r.stderr
    fresh = target.parent / "fresh"                 # step 3 whole: y/deep/z a link, z.d a directory
    a.envgit("restore", "3", "--target", str(fresh), check=True)
    assert os.readlink(fresh / "y" / "deep" / "z") == "../../.." and (fresh / "y/deep/z.d/f").is_file()
    written = sorted(os.path.relpath(os.path.join(d, f), top)
                     for d, _, files in os.walk(top) for f in files)
    assert [w for w in written if not w.startswith(("a/b/t/", "a/b/fresh/"))] == []   # nothing outside
    assert not (top / "a" / "file").exists() and not (top / "file").exists()


def test_a_path_asked_for_through_a_symlink_of_the_snapshot(attacker):
    a = attacker
    outside = place(a, "outside")
    assert a.run(f"ln -s {outside} x").returncode == 0
    target = place(a, "target") / "t"
    r = a.envgit("restore", "1", "--target", str(target), "--", "x/file")
    assert r.returncode == 2 and "not in the snapshot" in r.stderr
    r = a.envgit("restore", "1", "--target", str(target), "--", "x/")
    assert r.returncode == 0, r.stderr
    assert os.readlink(target / "x") == str(outside)
    assert os.listdir(outside) == []


def test_a_target_named_through_a_symlink_the_step_planted(attacker):
    a = attacker
    outside = place(a, "outside")
    assert a.run(f"ln -s {outside}/dest out && ln -s {outside} out2 && echo pwned > f").returncode == 0
    for target in (a.root / "out", a.root / "out" / "sub", a.root / "out2", "out2"):
        r = a.envgit("restore", "1", "--target", str(target))
        assert r.returncode == 2 and "inside the project" in r.stderr, (target, r.stderr)
    # and a link outside the project that names a place inside it
    link = place(a, "links") / "to-project"
    os.symlink(a.root, link)
    r = a.envgit("restore", "1", "--target", str(link / "x"))
    assert r.returncode == 2 and "inside the project" in r.stderr
    assert os.listdir(outside) == [] and not (a.root / "x").exists()


def test_restore_elsewhere_never_recreates_setuid_or_setgid_bits(attacker):
    """As a rewind does not (test_restore_setuid.py): a person restoring as root would
    otherwise write a step's setuid file owned by root."""
    a = attacker
    r = a.host("cp /usr/bin/id tool && chmod 6755 tool && mkdir shared && chmod 2775 shared")
    assert r.returncode == 0, r.stderr
    assert a.run("stat -c %a tool shared").stdout.split() == ["6755", "2775"]   # in the snapshot
    target = place(a, "target") / "t"
    a.envgit("restore", "1", "--target", str(target), check=True)
    assert os.stat(target / "tool").st_mode & 0o7777 == 0o755
    assert os.stat(target / "shared").st_mode & 0o7777 == 0o775
    assert (target / "tool").read_bytes() == open("/usr/bin/id", "rb").read()
