"""A denied path is said where the refusal happens: a step that opens one (cat .env, a key
under ~/.ssh, a file of a denied directory) reads its placeholder's one line, and the daemon,
which watches each placeholder (daemon/denials.py), tells the step's terminal at that moment,
once per path, naming the rule and where it is written; the step's end records it."""

import json

from conftest import CANARY, ENVGIT
from ptydrive import Term

POLICY = 'version: 1\nfilesystem:\n  deny_read: ["secrets/**"]\n'


def _said(text):
    return [ln for ln in text.replace("\r", "").splitlines() if "is hidden from steps" in ln]


def _end(proj, step):
    return json.loads(proj.envgit("show", str(step), "--json", check=True).stdout)


def test_a_denied_read_is_said_at_the_moment_it_happens(proj):
    proj.write_policy(POLICY)
    (proj.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (proj.root / "secrets").mkdir()
    (proj.root / "secrets" / "token").write_text(CANARY)
    # the step waits for a file the test makes only once the line has been seen
    script = ("cat .env; cat .env >/dev/null; cat secrets/token; "
              "n=0; while [ ! -e go ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done; echo finished")
    with Term([ENVGIT, "run", "--", "sh", "-c", script], proj.root, proj.env) as t:
        assert t.expect(b"secrets/token is hidden from steps", timeout=20), t.text
        assert "finished" not in t.text, t.text                 # said while the step still ran
        (proj.root / "go").write_text("")
        assert t.wait() == 0, t.text
    text = t.text
    assert CANARY not in text, text
    said = _said(text)
    assert len(said) == 2, said                               # once per path, however often read
    env_line = next(ln for ln in said if ".env is hidden" in ln)
    assert "'**/.env' (envgit's built-in list)" in env_line, env_line
    # the entry offered names this file only: '.env' would lift the deny from every .env
    assert "add './.env' to filesystem.allow_read" in env_line, env_line
    token_line = next(ln for ln in said if "secrets/token" in ln)
    assert "'secrets/**'" in token_line and "envgit.yaml:3" in token_line, token_line
    # what the step read in the file's place: its placeholder's one line, naming the rule
    assert "is hidden from this sandbox by filesystem.deny_read '**/.env'" in text, text
    end = _end(proj, 1)
    reads = {r["path"]: r for r in end["denied_reads"]}
    assert set(reads) == {str(proj.root / ".env"), str(proj.root / "secrets" / "token")}, end
    assert reads[str(proj.root / "secrets" / "token")]["where"].endswith("envgit.yaml:3"), reads
    assert "denied-read" in end["marks"], end


def test_a_step_that_opens_no_denied_path_is_told_nothing(proj):
    proj.write_policy(POLICY)
    (proj.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (proj.root / "README").write_text("hello\n")
    # a look at the name (stat, a listing) is not a read; only opening it is
    r = proj.run("cat README; test -e .env && echo there; ls -a >/dev/null")
    assert r.returncode == 0 and "hello" in r.stdout and "there" in r.stdout, r.stdout + r.stderr
    assert not _said(r.stderr), r.stderr
    assert _end(proj, 1)["denied_reads"] == []
    # the next step, given the same placeholders again, is told of its own read only
    r = proj.run("cat .env >/dev/null")
    assert len(_said(r.stderr)) == 1 and "step 2:" in r.stderr, r.stderr


def test_the_homes_denied_files_are_placeholders_that_say_why(proj):
    """~/.ssh is not simply absent: its files are placeholders, so `cat ~/.ssh/id_ed25519`
    says why instead of "No such file or directory"."""
    r = proj.run("ls ~/.ssh; cat ~/.ssh/id_ed25519; cat ~/.aws/credentials")
    assert CANARY not in r.stdout + r.stderr
    assert "id_ed25519" in r.stdout and "known_hosts" in r.stdout, r.stdout
    said = _said(r.stderr)
    assert len(said) == 2 and any("~/.ssh/id_ed25519" in ln and "'~/.ssh'" in ln for ln in said), said
    assert any("~/.aws/credentials" in ln for ln in said), said
