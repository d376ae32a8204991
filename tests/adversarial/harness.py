"""The attacker's harness: every test here attacks from inside a step, through the real
`envgit run` (or a real agent adapter), with a marker file or a canary as its only oracle.

A test asks for the `attacker` fixture by name (tests/adversarial/conftest.py; nothing to
import). It runs as root (how envgit runs in most containers and CI, and the more dangerous of
the two); a test whose outcome can depend on the uid says so with `@pytest.mark.both_uids(why)`
and runs again as an unprivileged user the fixture creates (bwrap without root;
tests/conftest.py's pytest_generate_tests). Both get the same layout as the rest of the suite:
a home with canary secrets, a git project `~/proj` inside it, `envgit init` done. A test that
cannot apply to one of the two says so with an explicit `pytest.skip` naming why; the user's
run is skipped only where the machine cannot create a user.
"""

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import ENVGIT, Env, make_home
from kit import nouserns
from kit.users import can_make_users, open_path_to, test_user


class Attacker(Env):
    """An Env whose commands run as `user` (None: as the test's own uid, root in CI)."""

    def __init__(self, home: Path, root: Path, user: str | None, no_userns: bool = False):
        super().__init__(home, root)
        self.user = user
        self.no_userns = no_userns      # envgit runs on a host without user namespaces (Landlock)
        self.env["ENVGIT_DAEMON_IDLE"] = "60"

    @property
    def is_root(self):
        return self.user is None and os.geteuid() == 0

    def _argv(self, argv, host=False):
        if self.no_userns and not host:
            return nouserns.wrap(argv, uid=pwd.getpwnam(self.user).pw_uid if self.user else None)
        return argv if self.user is None else ["runuser", "-u", self.user, "--", *argv]

    def envgit(self, *args, cwd=None, env=None, input=None, timeout=120, check=False):
        r = subprocess.run(self._argv([ENVGIT, *args]), cwd=cwd or self.root,
                           env={**self.env, **(env or {})}, input=input, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"envgit {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def host(self, script, cwd=None, env=None, timeout=60):
        """`sh -c SCRIPT` outside any sandbox, as the person (root or the test user) would run
        it later: how a planted file would be triggered."""
        return subprocess.run(self._argv(["sh", "-c", script], host=True), cwd=cwd or self.root,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout)

    def own(self, *paths):
        """Files the test wrote as root, handed to the test user. A walk that lets an entry
        vanish under it: the daemon clears a finished step's `.envgit/step-tmp/N` on its own
        time, so a `chown -R` of the project can meet a directory it listed and that is gone."""
        if not self.user:
            return
        pw = pwd.getpwnam(self.user)

        def give(path):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(path, pw.pw_uid, pw.pw_gid)

        for top in map(str, paths):
            give(top)
            for d, dirs, files in os.walk(top):
                for name in dirs + files:
                    give(os.path.join(d, name))

    def write_policy(self, text):
        (self.root / "envgit.yaml").write_text(text)
        self.own(self.root / "envgit.yaml")


@contextlib.contextmanager
def attacker_in(kind, tmp_path, no_userns=False):
    """An Attacker with its home and project, `envgit init` done: as root (`kind` "root"), or
    as an unprivileged user made for it ("user"; skipped where none can be made). What the
    `attacker` fixture yields. `no_userns`: every envgit command runs on a host that refuses
    user namespaces (kit/nouserns.py), so its steps run with Landlock."""
    if kind == "root":
        home = make_home(tmp_path)
        root = home / "proj"
        root.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
        a = Attacker(home, root, None, no_userns)
        a.envgit("init", check=True)
        try:
            yield a
        finally:
            a.stop()
        return
    if not can_make_users():
        pytest.skip("creating an unprivileged test user needs root and useradd")
    with test_user("envgit-a") as name:
        base = Path(tempfile.mkdtemp(prefix="envgit-adv-"))
        os.chmod(base, 0o755)
        home = make_home(base)
        root = home / "proj"
        root.mkdir()
        subprocess.run(["git", "init", "-q", "-b", "main", str(root)], check=True)
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True)
        a = Attacker(home, root, name, no_userns)
        with open_path_to(os.path.realpath(sys.executable), ENVGIT):
            try:
                a.envgit("init", check=True)
                yield a
            finally:
                a.stop()
                shutil.rmtree(base, ignore_errors=True)


__all__ = ["Attacker", "attacker_in", "open_path_to"]


def steps_of(a) -> list[dict]:
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    return steps.get("steps", steps) if isinstance(steps, dict) else steps


def taken_back(a, r, *paths) -> dict:
    """The step `r` ran wrote `paths` (escape routes), and envgit took them back at its end:
    said on its terminal, listed on the step, done by the step `envgit take-back N` right after
    it, and gone from the directory (or as they were). Returns the step."""
    steps = steps_of(a)
    s = [x for x in steps if x["argv"][:2] != ["envgit", "take-back"]][-1]
    assert "escape-route-written" in s["marks"], (s, r.stderr)
    for p in paths:
        assert p in s["taken_back"], (p, s["taken_back"])
        assert p in r.stderr and "took back" in r.stderr, r.stderr
    back = [x for x in steps if x["argv"] == ["envgit", "take-back", str(s["id"])]]
    assert back and "escape-route-taken-back" in back[0]["marks"], steps[-1]
    return s


def every_case(cases, check) -> None:
    """`check(case)` for each of `cases` in turn, in one world (a project, its daemon, its
    servers) that the cases share: each is its own steps, with its own oracle, and must leave
    nothing a later case would see. A case that fails does not stop the rest; the test fails
    at the end naming every case that failed and what it said."""
    cases, failed = list(cases), {}
    for case in cases:
        try:
            check(case)
        except Exception as e:          # an error too is one case's, named with the rest
            said = str(e)
            said = said if len(said) <= 2400 else f"{said[:800]}\n[…]\n{said[-1600:]}"
            failed[case] = f"{type(e).__name__}: {said}"
    assert not failed, f"{len(failed)} of {len(cases)} cases failed:\n\n" + \
        "\n\n".join(f"[{k}] {v}" for k, v in failed.items())


@contextlib.contextmanager
def put_back(a, *rels):
    """The project's `rels` as they were before the block, after it, as the person would put
    them back between steps: a file that was there gets its bytes and mode again, and one that
    was not is removed with every directory made for it; what a case of every_case changed
    that a later case would see."""
    saved, made = {}, set()
    for rel in rels:
        p = a.root / rel
        if p.is_file() and not p.is_symlink():
            saved[p] = (p.read_bytes(), p.stat().st_mode)
            continue
        top = p                                  # the topmost of it and its parents not there
        while not top.parent.exists() and top.parent != a.root:
            top = top.parent
        if not os.path.lexists(top):
            made.add(top)
    try:
        yield
    finally:
        for p in [*made, *saved]:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p in made and os.path.lexists(p) or p.is_symlink():
                p.unlink()
        for p, (data, mode) in saved.items():
            p.write_bytes(data)
            p.chmod(mode)
            a.own(p)
