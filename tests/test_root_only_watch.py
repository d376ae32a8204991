"""kernel.AdminTrees on a tree of its own: the root-only set follows creations, chmods, new
directories and renames through inotify, and the same without inotify (a rescan per call)."""

import os

import pytest

from envgit.sandbox.kernel import AdminTrees


@pytest.mark.sandbox           # without inotify the root-only set is rescanned with find(1)
@pytest.mark.parametrize("inotify", [True, False])
def test_the_set_follows_the_tree(tmp_path, inotify):
    top = tmp_path / "etc"
    (top / "sub").mkdir(parents=True)
    (top / "public").write_text("x")
    os.chmod(top / "public", 0o644)
    os.chmod(top, 0o755)
    os.chmod(top / "sub", 0o755)
    t = AdminTrees([str(top)])
    if not inotify:
        os.close(t.fd)
        t.fd = -1
    assert t.current() == set()
    secret = top / "secret"
    fd = os.open(secret, os.O_CREAT | os.O_WRONLY, 0o600)
    os.close(fd)
    (top / "sub" / "deep").mkdir(mode=0o755)
    deep_secret = top / "sub" / "deep" / "key"
    deep_secret.write_text("k")
    os.chmod(deep_secret, 0o640)
    private = top / "private"
    private.mkdir(mode=0o700)
    os.chmod(top / "public", 0o600)
    assert t.current() == {str(secret), str(deep_secret), str(private), str(top / "public")}
    os.chmod(secret, 0o644)
    os.chmod(private, 0o755)
    (private / "inner").write_text("i")
    os.chmod(private / "inner", 0o600)
    os.rename(deep_secret, top / "moved")
    assert t.current() == {str(top / "public"), str(private / "inner"), str(top / "moved")}
    os.unlink(top / "moved")
    assert t.current() == {str(top / "public"), str(private / "inner")}
