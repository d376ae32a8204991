"""The placeholders that cover a step's denied paths (sandbox/masks.py), made by the session
daemon, pooled across steps and watched with inotify (daemon/denials.py), attacked from inside
steps: names the daemon takes from the host's listing, the pool's sets, the watch's limits.

Oracles: the canary in anything a step or the person sees; whether later steps still start;
whether an open of a placeholder is said on the step's terminal and kept on its end."""

import json

import pytest

from conftest import CANARY

pytestmark = pytest.mark.both_uids(
    "the placeholders are made by the daemon, as the person, and bound by bwrap without root in "
    "a user namespace: what a name or a limit does must hold for both")


def _said(text):
    return [ln for ln in text.replace("\r", "").splitlines() if "is hidden from steps" in ln]


def _end(a, step):
    return json.loads(a.envgit("show", str(step), "--json", check=True).stdout)


def _last_step(a):
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    return max(s.get("id", s.get("step")) for s in steps)

def _a_new_secret_is_said_once(a, directory, name):
    """The person's new secret `directory/name` read by a step: never shown, said once, kept on
    the step's end."""
    (a.root / directory).mkdir()
    (a.root / directory / name).write_text(f"TOKEN={CANARY}\n")
    a.own(a.root / directory)
    r = a.run(f"cat {directory}/{name}; echo read")
    assert CANARY not in r.stdout + r.stderr and "read" in r.stdout, r.stdout + r.stderr
    said = _said(r.stderr)
    assert len(said) == 1 and f"{directory}/{name}" in said[0], r.stderr
    reads = _end(a, _last_step(a))["denied_reads"]
    assert [x["path"] for x in reads] == [str(a.root / directory / name)], reads



def test_a_denied_name_that_is_not_utf8_leaves_later_steps_able_to_start(attacker):
    """A step makes a directory whose name is not UTF-8 holding a `.env` (denied by its own
    name, `**/.env`), and a denied directory whose entry's name is not UTF-8: the next views
    make placeholders naming them. Every later step must still start (a placeholder's line that
    cannot be written would fail each view, for good, until the person finds the file), and
    the person's secret put there is still not read."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets/**"]\n')
    r = a.run("d=$(printf 'z\\377'); mkdir \"$d\" && echo planted > \"$d/.env\" && "
              "mkdir secrets && echo planted > \"secrets/k$(printf '\\376')\" && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.host(f"printf '{CANARY}\\n' > \"z$(printf '\\377')/.env\" && "
               f"printf '{CANARY}\\n' > \"secrets/k$(printf '\\376')\"")
    assert r.returncode == 0, r.stderr
    r = a.run("cat z*/.env secrets/k*; echo ran")
    assert r.returncode == 0 and "ran" in r.stdout, r.stdout + r.stderr
    assert CANARY not in r.stdout + r.stderr, r.stdout
    assert r.stdout.count("is hidden from this sandbox") == 2, r.stdout
    assert len(_said(r.stderr)) == 2, r.stderr
    assert len(_end(a, _last_step(a))["denied_reads"]) == 2
    r = a.run("echo still")
    assert r.returncode == 0 and "still" in r.stdout, r.stdout + r.stderr


def test_planted_denied_files_do_not_push_a_secret_out_of_the_watch(attacker):
    """A step plants 600 `.env` files (denied by their own name) in directories that sort
    before the person's: a view covers them first. The person's secret written later must
    still be watched: a step that opens it is told, and its end keeps the read."""
    a = attacker
    r = a.run("for i in $(seq 600); do mkdir -p d$i && echo planted > d$i/.env; done; echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("cat d1/.env >/dev/null; echo viewed")        # a view that covers all of them
    assert "viewed" in r.stdout, r.stdout + r.stderr
    _a_new_secret_is_said_once(a, "later", ".env")


def test_escape_sequences_in_a_denied_name_never_reach_the_terminal_raw(attacker):
    """A step names a directory with terminal escapes (a title, a screen clear, a line that
    would fake envgit's own) and puts a `.env` and a denied directory's entry there; the next
    step opens their placeholders: what its terminal shows and `envgit show` prints carry the
    escapes inert, never as bytes a terminal obeys."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets/**"]\n')
    evil = "\\033]0;owned\\007\\033[2J\\rfake\\n\\302\\233"
    r = a.run(f"d=\"$(printf '{evil}')\"; mkdir -p \"$d\" secrets && echo p > \"$d/.env\" && "
              f"echo p > \"secrets/$(printf '{evil}')k\" && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("for f in */.env secrets/*; do cat \"$f\" >/dev/null; done; echo read")
    assert "read" in r.stdout, r.stdout + r.stderr
    said = _said(r.stderr)
    assert len(said) == 2 and all("\\x1b]0;owned\\x07" in ln for ln in said), r.stderr
    shown = a.envgit("show", str(_last_step(a))).stdout
    for text in (r.stderr, r.stdout, shown):
        assert not any(c in text for c in "\x1b\x07\x9b\r"), repr(text)
    assert "\\x1b[2J" in shown, shown


FLOOD = ("import os, time\n"
         "t = time.monotonic()\n"
         "while time.monotonic() - t < 3:\n"
         "    for p in ('/etc/shadow', '/etc/gshadow'):\n"
         "        os.close(os.open(p, os.O_RDONLY))\n")


def test_two_steps_at_once_each_told_of_its_own_reads_under_a_flood(attacker):
    """Step A opens two placeholders as fast as it can for 3 s (a flood of inotify events,
    no two alike in a row, so the kernel merges none) and then a third; step B, running at the
    same time, opens the project's .env once. Each is told of its own reads only, on its own
    terminal, and each end keeps its own: an open never names the other step, the flood does
    not drop B's, and the daemon still answers."""
    import subprocess
    import time

    from conftest import ENVGIT
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets/**"]\n')
    (a.root / "flood.py").write_text(FLOOD)
    (a.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (a.root / "secrets").mkdir()
    (a.root / "secrets" / "k").write_text(f"{CANARY}\n")
    a.own(a.root / "flood.py", a.root / ".env", a.root / "secrets")
    first = subprocess.Popen(a._argv([ENVGIT, "run", "--", "sh", "-c",
                                      "python3 flood.py; cat secrets/k >/dev/null; echo A"]),
                             cwd=a.root, env=a.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1)
        t0 = time.monotonic()
        b = a.run("cat .env >/dev/null; echo B")
        took = time.monotonic() - t0
        out, err = first.communicate(timeout=60)
    finally:
        first.kill()
    assert "A" in out and "B" in b.stdout, (out, err, b.stdout, b.stderr)
    assert took < 10, took
    steps = json.loads(a.envgit("log", "--json", check=True).stdout)
    steps = steps.get("steps", steps) if isinstance(steps, dict) else steps
    ids = {" ".join(s["argv"]).split(";")[0][-12:]: s.get("id", s.get("step")) for s in steps}
    a_id, b_id = ids["python3 flood.py"[-12:]], ids["cat .env >/dev/null"[-12:]]
    b_said, a_said = _said(b.stderr), _said(err)
    assert len(b_said) == 1 and f"step {b_id}: .env is hidden" in b_said[0], b.stderr
    assert len(a_said) == 3 and all(f"step {a_id}:" in ln for ln in a_said), err
    assert [r["path"] for r in _end(a, b_id)["denied_reads"]] == [str(a.root / ".env")]
    assert {r["path"] for r in _end(a, a_id)["denied_reads"]} == {
        "/etc/shadow", "/etc/gshadow", str(a.root / "secrets" / "k")}
    assert CANARY not in out + err + b.stdout + b.stderr


def test_denied_directories_a_step_moved_away_do_not_crowd_out_the_persons(attacker):
    """A step plants 250 `.env` directories that sort ahead of the person's denied `secrets/`;
    a view covers them, then a step moves them all (their own name denies them, so their
    directories move) and the next view covers them again at their new places, with the
    person's `secrets/` made meanwhile. It must be watched: the earlier view's placeholders,
    kept in the pooled set, take none of the watches a view has."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets"]\n')
    r = a.run("for i in $(seq 250); do mkdir -p a$i/.env && echo p > a$i/.env/x; done; echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("for i in $(seq 250); do mv a$i b$i || exit 1; done; echo moved")
    assert "moved" in r.stdout, r.stdout + r.stderr
    _a_new_secret_is_said_once(a, "secrets", "k")


def test_a_home_denied_directory_that_is_a_symlink_reads_as_a_directory_of_placeholders(attacker):
    """~/.aws is a link to where the person keeps it (a dotfiles checkout): the step's view
    shows a directory of placeholders there, as for a real ~/.aws, so `cat ~/.aws/credentials`
    says why instead of "Not a directory", and never gives the file."""
    import shutil
    from pathlib import Path
    a = attacker
    home = Path(a.host("echo $HOME").stdout.strip())     # a created user's: runuser's passwd home
    made = not home.exists()
    real = home / "dotfiles" / "aws"
    try:
        real.mkdir(parents=True)
        (real / "credentials").write_text(f"[default]\naws_secret_access_key={CANARY}\n")
        shutil.rmtree(home / ".aws", ignore_errors=True)
        (home / ".aws").symlink_to(real)
        a.own(home) if made else a.own(home / "dotfiles")
        r = a.run("ls ~/.aws; cat ~/.aws/credentials; cat ~/dotfiles/aws/credentials; true")
    finally:
        if made:
            shutil.rmtree(home, ignore_errors=True)
    assert CANARY not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "credentials" in r.stdout and "is hidden from this sandbox" in r.stdout, r.stdout + r.stderr
    said = _said(r.stderr)
    assert len(said) == 1 and "~/.aws/credentials is hidden from steps" in said[0], r.stderr


def test_a_project_directory_named_tilde_cannot_make_envgit_advise_allowing_the_homes_key(attacker):
    """A step makes `~/.ssh/id_ed25519` inside the project (a directory named `~`; the file
    is denied by `**/id_ed25519`) and opens it. envgit's line must not read as the home's key
    nor advise `allow_read: ["~/.ssh/id_ed25519"]`, which names the person's real key: the
    person who followed that advice handed it to every step (the canary, read)."""
    import re
    a = attacker
    r = a.run("mkdir -p '~/.ssh' && echo planted > '~/.ssh/id_ed25519' && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("cat '~/.ssh/id_ed25519' >/dev/null; echo read")
    said = _said(r.stderr)
    assert len(said) == 1, r.stderr
    assert not re.search(r"step \d+: ~/", said[0]), said[0]
    advised = re.search(r"add '([^']*)' to filesystem.allow_read", said[0])
    assert advised and not advised.group(1).startswith("~"), said[0]
    # the advice, followed, lets the step read the file it made, and only that
    a.write_policy(f'version: 1\nfilesystem:\n  allow_read: ["{advised.group(1)}"]\n')
    r = a.run("cat '~/.ssh/id_ed25519' ~/.ssh/id_ed25519; true")
    assert "planted" in r.stdout and CANARY not in r.stdout + r.stderr, r.stdout + r.stderr


def test_a_denied_name_holding_glob_characters_cannot_make_envgit_advise_a_pattern(attacker):
    """A step makes directories literally named `**`, `*` and `[d]` holding a `.env` each and
    opens them. envgit's advice must not be an allow_read entry that, as a pattern, lifts the
    deny from the person's own `.env` files (the root one, deploy/.env): followed, it would
    hand them to every step (the canary)."""
    import re
    a = attacker
    (a.root / ".env").write_text(f"TOKEN={CANARY}\n")
    (a.root / "deploy").mkdir()
    (a.root / "deploy" / ".env").write_text(f"TOKEN={CANARY}\n")
    a.own(a.root / ".env", a.root / "deploy")
    r = a.run("for d in '**' '*' '[d]'; do mkdir -p \"$d\" && echo planted > \"$d/.env\"; done; echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("for d in '**' '*' '[d]'; do cat \"$d/.env\" >/dev/null; done; echo read")
    said = _said(r.stderr)
    assert len(said) == 3, r.stderr
    advised = [m.group(1) for ln in said if (m := re.search(r"add '([^']*)' to filesystem.allow_read", ln))]
    for entry in advised:
        a.write_policy(f'version: 1\nfilesystem:\n  allow_read: ["{entry}"]\n')
        r = a.run("cat .env deploy/.env; true")
        assert CANARY not in r.stdout + r.stderr, (entry, r.stdout)


def test_a_second_name_of_a_denied_file_is_said_as_such_not_with_an_allow_read_that_does_nothing(attacker):
    """A step makes a hard link `notes.txt` to a denied name before the person's secret is
    written there; the next step opens it. Its line must say it is another name of a denied
    file, not a deny_read entry nobody wrote nor an allow_read entry that lifts nothing (the
    second name stays hidden while it leads to the secret); the secret is never read."""
    a = attacker
    a.write_policy('version: 1\nfilesystem:\n  deny_read: ["secrets/**"]\n')
    r = a.run("mkdir -p secrets && echo placeholder > secrets/token.txt && ln secrets/token.txt notes.txt "
              "&& echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    assert a.host(f"echo {CANARY} > secrets/token.txt").returncode == 0
    r = a.run("cat notes.txt; echo read")
    assert CANARY not in r.stdout + r.stderr and "read" in r.stdout, r.stdout + r.stderr
    said = _said(r.stderr)
    assert len(said) == 1 and "notes.txt" in said[0], r.stderr
    assert "another name" in said[0] and "add 'notes.txt'" not in said[0], said[0]
    assert "deny_read 'another name" not in said[0] + r.stdout, said[0] + r.stdout
    assert "another name" in r.stdout, r.stdout            # the placeholder's own line says it too


def test_a_process_left_behind_cannot_open_a_placeholder_in_the_next_steps_name(attacker):
    """A step leaves a process behind (its own session, deaf to SIGHUP and SIGTERM) that opens
    the project's .env two seconds later, when the next step runs with the same pooled set of
    placeholders: the next step must be told nothing and keep no read, and the process must
    be gone with its step (its marker never written)."""
    a = attacker
    (a.root / ".env").write_text(f"TOKEN={CANARY}\n")
    a.own(a.root / ".env")
    r = a.run("setsid sh -c \"trap '' HUP TERM; sleep 2; cat .env > left.out; echo alive > left-marker\" "
              "</dev/null >/dev/null 2>&1 & echo left")
    assert "left" in r.stdout, r.stdout + r.stderr
    r = a.run("sleep 4; echo second")
    assert "second" in r.stdout, r.stdout + r.stderr
    assert not _said(r.stderr), r.stderr
    assert _end(a, _last_step(a))["denied_reads"] == []
    assert not (a.root / "left-marker").exists() and not (a.root / "left.out").exists()


def test_a_denied_name_linked_to_a_system_directory_leaves_that_directory_to_later_steps(attacker):
    """`a/.env -> /etc`: a denied name leading out of the writable areas to a directory. Masking
    what it leads to would take /etc from every later step (no /etc/passwd, a placeholder
    /etc/gitconfig); nothing is read through it that the step cannot read by its own path."""
    a = attacker
    r = a.run("mkdir -p a && ln -s /etc a/.env && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.run("head -1 /etc/passwd; test -d /etc/ssl && echo ssl-there; git config --system --list >/dev/null 2>&1; "
              "echo rc=$?")
    assert r.stdout.startswith("root:") and "ssl-there" in r.stdout, r.stdout + r.stderr
    assert "is hidden from this sandbox" not in r.stdout and not _said(r.stderr), r.stdout + r.stderr
    # a project .env that is the person's own file stays hidden as before
    (a.root / ".env").write_text(f"TOKEN={CANARY}\n")
    a.own(a.root / ".env")
    r = a.run("cat .env")
    assert CANARY not in r.stdout and "is hidden from this sandbox" in r.stdout, r.stdout
