"""A denied file carried away from its mask: renaming the file itself, or any directory
between the project root and it (the red team's case, round 14, is the last test here),
so that on the host the person's secret sits at a name no deny matches. Every directory
above a masked path in a writable area is a mount point inside the step (view.py _pinned):
renaming or removing it fails with EBUSY, as for the parents of protected paths.

Oracles: the canary in a later step's output, in `envgit diff`, on the step's ui page."""

import json

import pytest

from conftest import CANARY
from uikit import UI

pytestmark = pytest.mark.both_uids(
    "every directory above a denied path is a mount point in the step's view: as a non-root user "
    "bwrap builds it in a user namespace, where DAC lets the person rename their own directories: the "
    "pin must hold there too")


def _secret(a, rel):
    p = a.root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{CANARY}-{rel}\n")
    top = a.root / rel.split("/", 1)[0]
    a.own(top)


def _no_canary(a, *texts):
    for t in texts:
        assert CANARY not in t, t


def _paths(a, step):
    show = json.loads(a.envgit("show", str(step), "--json", check=True).stdout)
    return {p["path"] for p in show["snapshot"]["paths"]}


def test_every_directory_above_a_denied_path_stays_put(attacker):
    """A deep named deny: the file, its directory and every directory up to the project root
    refuse rename and removal; the person sees why. A default glob deny (`**/.env`) holds
    wherever its directories go, so they move (no pin, no bind paid), the file itself not:
    the secret is denied at every name it has."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["a/b/c/key.txt"]\n')
    _secret(a, "a/b/c/key.txt")
    _secret(a, "svc/api/.env")
    r = a.run("for m in 'a/b/c/key.txt k1' 'a/b/c c2' 'a/b b2' 'a a2' 'svc/api/.env e1' 'svc/api api2' 'svc s2'; do "
              "  set -- $m; mv \"$1\" \"$2\" 2>&1; done; rm -rf a 2>&1; "
              "mkdir -p .git/objects/ab && mv api2 .git/objects/ab/ 2>&1; "
              "cat k1 c2/key.txt b2/c/key.txt a2/b/c/key.txt e1 api2/.env s2/api/.env 2>/dev/null; true")
    _no_canary(a, r.stdout, r.stderr)
    assert "Device or resource busy" in r.stdout, r.stdout          # what mv and rm say: why
    r2 = a.run("cat a/b/c/key.txt */.env */*/.env .git/objects/ab/*/.env 2>&1; "
               "find . -path ./.git -prune -o -type f -print | grep -v '^./.git' | xargs cat 2>/dev/null; true")
    _no_canary(a, r2.stdout, r2.stderr)
    assert (a.root / "a/b/c/key.txt").read_text().startswith(CANARY)     # the person's file, in place
    # the person's .env stays where it was; a copy mv made across a mount holds the placeholder's line
    envs = [p for p in a.root.rglob(".env") if p.is_file()]
    kept = [p for p in envs if p.read_text().startswith(CANARY)]
    assert len(kept) == 1, envs
    assert all("is hidden from this sandbox" in p.read_text() for p in envs if p not in kept), envs
    _no_canary(a, a.envgit("diff", "1", "2").stdout, a.envgit("show", "2").stdout)
    with UI(a) as ui:
        for step in (1, 2):
            _no_canary(a, ui.get(f"/steps/{step}")[2])


def test_a_file_next_to_a_denied_one_still_moves(attacker):
    """Only the directories above a masked path are pinned: siblings and their contents are
    the step's to rename, and files beside the secret change as before."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["conf/master.key"]\n')
    _secret(a, "conf/master.key")
    (a.root / "conf" / "app.yml").write_text("x: 1\n")
    (a.root / "other").mkdir()
    (a.root / "other" / "f").write_text("f\n")
    a.own(a.root / "conf", a.root / "other")
    r = a.run("mv conf/app.yml conf/app2.yml && mv other other2 && echo y >> conf/app2.yml && echo ok")
    assert "ok" in r.stdout, r.stdout + r.stderr
    assert (a.root / "other2" / "f").exists() and (a.root / "conf" / "app2.yml").read_text() == "x: 1\ny\n"


def test_a_second_name_made_before_the_secret_arrived(attacker):
    """A step makes a file at a denied name and a hard link to it elsewhere (or a symlinked
    directory in front of it); the person later writes the secret into the denied name, in
    place. Neither the other name nor the directory the link leads to gives it back."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets/**", "config/master.key"]\n')
    r = a.run("mkdir -p secrets stash && echo placeholder > secrets/token.txt && "
              "ln secrets/token.txt notes.txt && ln -s stash config && ln -s ../x2 secrets/link.txt && "
              "echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.host(f"echo {CANARY}-token > secrets/token.txt && echo {CANARY}-master > config/master.key "
               f"&& echo {CANARY}-link > secrets/link.txt")
    assert r.returncode == 0, r.stderr
    r = a.run("cat notes.txt stash/master.key x2 2>&1; true")
    _no_canary(a, r.stdout)
    # the symlinks gone, the other names moved: all still the person's secret
    a.run("rm -f config secrets/link.txt; mv notes.txt n2; mv stash s2; mv x2 x3; true")
    r = a.run("cat notes.txt n2 stash/master.key s2/master.key x2 x3 2>&1; true")
    _no_canary(a, r.stdout)
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    last = max(s["step"] if "step" in s else s["id"] for s in (steps if isinstance(steps, list) else steps["steps"]))
    for n in range(1, last + 1):
        _no_canary(a, a.envgit("show", str(n)).stdout, a.envgit("diff", str(max(n - 1, 1)), str(n)).stdout)
    with UI(a) as ui:
        for n in range(1, last + 1):
            _no_canary(a, ui.get(f"/steps/{n}")[2])


POLICY = ("version: 1\nfilesystem:\n  deny_read: [\"secrets/**\", \"config/master.key\"]\n"
          "  allow_write: [\".\"]\n")


def test_renaming_a_denied_paths_directory_does_not_free_the_secret(attacker):
    """The red team's case (round 14): `filesystem.deny_read: ["secrets/**"]` masks each file
    under secrets/ inside the sandbox, but the directory itself was the step's to rename (it is
    in the writable project): `mv secrets s2` succeeded, the masks moved with it inside, and on
    the host the person's file was now s2/key.txt. The step's snapshot recorded s2/key.txt as
    added, content and all: `envgit ui`'s step page showed its diff (the canary on the page);
    and the next step read it outright, since no deny matches s2/**. Oracles: the canary in the
    next step's output, and in the page."""
    a = attacker
    a.write_policy(POLICY)
    for d, f in (("secrets", "key.txt"), ("config", "master.key")):
        (a.root / d).mkdir()
        (a.root / d / f).write_text(f"{CANARY}-{f}\n")
        a.own(a.root / d, a.root / d / f)
    first = a.run("cat secrets/key.txt config/master.key; mv secrets s2; mv config c2; echo moved")
    assert CANARY not in first.stdout, first.stdout            # denied, as it should be
    second = a.run("cat s2/key.txt c2/master.key 2>&1; true")
    with UI(a) as ui:
        page = ui.get("/steps/1")[2]
    assert CANARY not in second.stdout and CANARY not in page, (
        "a step renamed the directories above denied files; the next step read them "
        f"({second.stdout.strip()!r}) and the step page shows them ({CANARY in page})")
