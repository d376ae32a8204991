"""Class 14, two parts.

/tmp: steps of a session shared one /tmp, so a step could leave a poisoned cache (pip's and
npm's are pointed there) or a script for the next step to run. Each step now gets its own.
The oracle: a script planted in /tmp that would touch a marker if the next step ran it.

Rendering: file names, ref names, hosts and command lines come from the step; printed raw,
escape sequences in them fake what the person reads (clear the screen, recolour, retitle).
The oracle: no ESC (or other control byte) reaches the output of show, log, diff, pending or
the ask prompt, while the name is still shown, escaped.
"""

import time

import pytest

ESC_NAME = "evil\x1b[2J\x1b]0;owned\x07\u009b31m\u202ename"
SHOWN = "evil\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202ename"


def _controls(text):
    return [c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0
            or c in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"]


STEP_TMP = ("a step's /tmp is a directory on the host the daemon removes afterwards as the person: a root daemon "
            "removes what a step locked (chmod 000) whatever its mode, a non-root one must give the modes back first")


@pytest.mark.both_uids(STEP_TMP +
                       "; and what a step leaves there must stay out of the next step's view for both")
def test_a_step_does_not_see_what_the_previous_step_left_in_tmp(attacker):
    marker = attacker.root / "ran-planted-script"
    r = attacker.run(f"mkdir -p /tmp/.cache/pip && echo poisoned > /tmp/.cache/pip/wheel && "
                     f"printf '#!/bin/sh\\ntouch {marker}\\n' > /tmp/helper.sh && chmod +x /tmp/helper.sh && "
                     f"cat /tmp/.cache/pip/wheel")
    assert r.returncode == 0 and r.stdout == "poisoned\n", r.stderr      # /tmp works in a step
    r = attacker.run("[ -x /tmp/helper.sh ] && /tmp/helper.sh; cat /tmp/.cache/pip/wheel; ls -A /tmp; "
                     "echo next > /tmp/mine && cat /tmp/mine")
    assert not marker.exists()
    assert "poisoned" not in r.stdout
    assert r.stdout.strip().endswith("next")
    # and nothing of either step is left behind on the host
    left = attacker.root / ".envgit" / "step-tmp"
    for _ in range(300):                    # removed in a thread: seconds, on a loaded machine
        if not left.exists() or not any(left.iterdir()):
            break
        time.sleep(0.1)
    assert not left.exists() or not any(left.iterdir()), list(left.iterdir())


@pytest.mark.both_uids(STEP_TMP +
                       "; and what a step leaves there must stay out of the next step's view for both")
def test_a_step_that_locks_its_tmp_still_gets_it_removed(attacker):
    r = attacker.run("mkdir -p /tmp/a/b && touch /tmp/a/b/f && chmod 000 /tmp/a/b /tmp/a")
    assert r.returncode == 0, r.stderr
    left = attacker.root / ".envgit" / "step-tmp"
    for _ in range(300):                    # removed in a thread: seconds, on a loaded machine
        if not any(left.iterdir()):
            break
        time.sleep(0.1)
    assert not any(left.iterdir())


def test_escape_codes_in_file_names_are_shown_inert(attacker):
    assert attacker.run("true").returncode == 0
    r = attacker.envgit("run", "--", "sh", "-c", 'printf "line \\033[8mhidden\\033[0m\\n" > "$1"', "sh", ESC_NAME)
    assert r.returncode == 0, r.stderr
    assert (attacker.root / ESC_NAME).exists()
    step = attacker.envgit("log").stdout.strip().splitlines()[-1].split()[0]
    before = str(int(step) - 1)
    for args in (("show", step), ("diff", before, step), ("log",), ("diff", "--stat", before, step),
                 ("diff", "--json", before, step), ("show", step, "--json")):
        out = attacker.envgit(*args)
        assert out.returncode == 0, out.stderr
        assert _controls(out.stdout) == [], (args, out.stdout)
        if args != ("log",):
            assert SHOWN in out.stdout or "evil\\u001b[2J" in out.stdout, (args, out.stdout)
    assert "line \\x1b[8mhidden" in attacker.envgit("diff", before, step).stdout     # contents too


def test_the_ask_prompt_and_pending_show_inert_names(capfd, monkeypatch):
    """The question a person answers: its host, path and ref names are the step's choice."""
    from envgit.commands import asks as commands
    from envgit.run import Terminal
    q = {"step": 3, "method": "POST", "host": "git.example\x1b[2K", "path": "/r.git/git-receive-pack\r",
         "kind": "git-push", "rule": "irreversible", "refs": [{"ref": "refs/heads/\x1b]8;;http://x\x07main",
                                                             "old": "a" * 40, "new": "b" * 40}]}
    t = Terminal()
    t.tty = None
    t.push({"push": "ask", "id": 1, "question": q, "timeout": 5}, None)
    t.push({"push": "notice", "text": "envgit: denied GET h\x1b[31m/x"}, None)

    class Conn:
        def request(self, msg):
            return {"asks": [{"id": 1, "step": 3, "question": q, "asked_at": time.time()}]}
    monkeypatch.setattr("envgit.daemon.client.connect", lambda *a, **k: Conn())
    monkeypatch.setattr(commands, "find_project", lambda: None)

    class Args:
        json = False
    commands.cmd_pending(Args())
    out, err = capfd.readouterr()
    assert _controls(out + err) == [], out + err
    assert "git.example\\x1b[2K" in err and "refs/heads/\\x1b]8;;http://x\\x07main" in err
    assert "git.example\\x1b[2K" in out and "git-receive-pack\\r" in out


def test_the_notices_after_a_step_name_paths_inert(attacker):
    """What envgit run says after a step (a policy file or escape route written) names the
    paths the step chose."""
    r = attacker.envgit("run", "--", "sh", "-c", 'mkdir -p "$1" && echo "version: 1" > "$1/envgit.yaml"',
                        "sh", ESC_NAME)
    assert r.returncode == 0, r.stderr
    assert "policy-file-written" in r.stderr
    assert _controls(r.stderr) == [], r.stderr
    assert SHOWN + "/envgit.yaml" in r.stderr
