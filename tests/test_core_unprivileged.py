"""The same sandbox run by an unprivileged user the test creates (bwrap without root)."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import CANARY, ENVGIT, make_home

sys.path.insert(0, str(Path(__file__).resolve().parent / "adversarial"))
from kit.users import open_path_to, test_user  # noqa: E402

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="creating a test user needs root and useradd")


@pytest.fixture
def user():
    with test_user() as name:
        base = Path(tempfile.mkdtemp(prefix="envgit-unpriv-"))
        os.chmod(base, 0o755)
        home = make_home(base)
        proj = home / "proj"
        proj.mkdir()
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        with open_path_to(os.path.realpath(sys.executable), ENVGIT):
            try:
                yield name, home, proj
            finally:
                subprocess.run(["runuser", "-u", name, "--", ENVGIT, "daemon", "stop"], cwd=proj,
                               env={"PATH": os.environ["PATH"], "HOME": str(home)}, capture_output=True)
                shutil.rmtree(base, ignore_errors=True)


def as_user(user, *args, input=None):
    name, home, proj = user
    return subprocess.run(["runuser", "-u", name, "--", ENVGIT, *args], cwd=proj, input=input,
                          env={"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8",
                               "GITHUB_TOKEN": "ghp_unpriv", "ENVGIT_DAEMON_IDLE": "60"},
                          capture_output=True, text=True, timeout=120)


def test_unprivileged_user_sandbox(user):
    assert as_user(user, "init").returncode == 0
    r = as_user(user, "run", "--", "sh", "-c", "id -u; cat ~/.ssh/id_ed25519")
    assert CANARY not in r.stdout + r.stderr
    assert r.returncode != 0 or "~/.ssh/id_ed25519 is hidden from steps" in r.stderr, r.stdout + r.stderr
    assert r.stdout.split()[0] != "0"
    r = as_user(user, "run", "--", "sh", "-c", "echo hi > ok.txt && env")
    assert r.returncode == 0 and "ghp_unpriv" not in r.stdout
    assert (user[2] / "ok.txt").read_text() == "hi\n"
    r = as_user(user, "run", "--", "sh", "-c", "echo x > envgit.yaml")
    assert r.returncode != 0
    (user[2] / ".env").write_text(CANARY)
    subprocess.run(["chown", user[0], str(user[2] / ".env")], check=True)
    r = as_user(user, "run", "--", "cat", ".env")
    # its placeholder's line, and the terminal told why (the daemon saw the open: as this user too)
    assert CANARY not in r.stdout and "is hidden from this sandbox" in r.stdout, r.stdout
    assert r.stderr.count(".env is hidden from steps") == 1, r.stderr
    r = as_user(user, "run", "--", "unshare", "-U", "true")
    assert r.returncode != 0
    assert as_user(user, "fsck").returncode == 0
    log = as_user(user, "log").stdout.splitlines()
    # five steps, and the .env the person wrote between two of them as a change of its own
    assert len(log) == 6 and sum("outside" in line for line in log) == 1, log


def test_unreadable_files_the_user_owns_are_still_kept(user):
    """A step that `chmod 000`s a file or a directory of its own (as a build tool or an agent
    may) must not make the next snapshots fail: the snapshot reads what the user owns whatever
    its mode, and a rewind brings back both the content and the mode."""
    proj = user[2]
    assert as_user(user, "init").returncode == 0
    r = as_user(user, "run", "--", "sh", "-c",
                "echo kept > f && chmod 000 f && mkdir -p d/e && echo deep > d/e/x && "
                "chmod 000 d/e/x d/e && chmod 0 d")
    assert r.returncode == 0, r.stderr
    r = as_user(user, "run", "--", "sh", "-c", "echo later > g")
    assert r.returncode == 0 and "snapshot" not in r.stderr.lower(), r.stderr
    r = as_user(user, "run", "--", "sh", "-c", "chmod 700 d d/e d/e/x && echo changed > d/e/x "
                "&& chmod 0 d/e/x d/e d && chmod 0 f")
    assert r.returncode == 0 and "snapshot" not in r.stderr.lower(), r.stderr
    r = as_user(user, "rewind", "2", "--yes")          # over the shut directory, in place
    assert r.returncode == 0, r.stdout + r.stderr
    os.chmod(proj / "d", 0o700), os.chmod(proj / "d" / "e", 0o700)
    assert (proj / "d" / "e" / "x").read_bytes() == b"deep\n"      # (the test runs as root)
    os.chmod(proj / "d", 0), os.chmod(proj / "d" / "e", 0)
    r = as_user(user, "run", "--", "sh", "-c", "chmod 700 d d/e && rm -rf d f")
    assert r.returncode == 0, r.stderr
    r = as_user(user, "rewind", "2", "--yes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (proj / "g").read_text() == "later\n"
    assert os.stat(proj / "f").st_mode & 0o777 == 0
    assert os.stat(proj / "d").st_mode & 0o777 == 0
    os.chmod(proj / "d", 0o700), os.chmod(proj / "d" / "e", 0o700), os.chmod(proj / "f", 0o600)
    assert (proj / "f").read_text() == "kept\n"
    assert (proj / "d" / "e" / "x").read_text() == "deep\n"
