"""A project deep enough that its sockets' paths do not fit in a sockaddr_un (108 bytes)."""

import shutil

import pytest

from conftest import Env, make_home


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed")
def test_a_deep_project_works(tmp_path):
    home = make_home(tmp_path)
    root = home / ("a-rather-long-directory-name-" * 3) / "project"
    root.mkdir(parents=True)
    assert len(str(root / ".envgit" / "net" / "proxy.sock")) > 110
    env = Env(home, root)
    env.envgit("init", check=True)
    env.write_policy('version: 1\nnetwork:\n  allow: ["example.com"]\n')
    try:
        r = env.run("echo deep > f.txt && cat f.txt")
        assert r.returncode == 0 and r.stdout == "deep\n", r.stderr
        assert env.envgit("log", check=True).stdout.count("\n") == 1
    finally:
        env.stop()
