"""Red team, round 14: a step renames the DIRECTORY above a denied path; the secret then
lives under a name no deny matches.

`filesystem.deny_read: ["secrets/**"]` masks each file under secrets/ inside the sandbox,
but the directory itself is the step's to rename (it is in the writable project): `mv
secrets s2` succeeds, the masks move with it inside, and on the host the person's file is
now s2/key.txt. The step's snapshot records s2/key.txt as added, content and all: `envgit
ui`'s step page shows its diff (the canary on the page); and the next step reads it
outright, since no deny matches s2/**.

Oracles: the canary in the next step's output, and in the page."""

from harness import CANARY, attacker  # noqa: F401  (the fixture)
from uikit import UI

POLICY = ("version: 1\nfilesystem:\n  deny_read: [\"secrets/**\", \"config/master.key\"]\n"
          "  allow_write: [\".\"]\n")


def test_renaming_a_denied_paths_directory_does_not_free_the_secret(attacker):
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
