"""Attacks on remotes from inside a step: the auto-push runs on the host after every step,
outside any sandbox (as root in most CI), and the remote's key and configuration live in the
person's home. A step must not get code into the push, read the key, or redirect the push.
Oracles: a marker file outside the project, the key's bytes, the configuration's bytes."""

import json
import time

import pytest

from conftest import CANARY


def _remote(attacker, s3):
    # runuser resets HOME to the test user's (absent) home: the configuration lives in this one
    attacker.env.update(s3.env, ENVGIT_MACHINE="m1", XDG_CONFIG_HOME=str(attacker.home / ".config"))
    attacker.envgit("remote", "add", "ci", s3.url(), "--endpoint", s3.endpoint, check=True)
    attacker.envgit("remote", "set", "ci", "--auto", check=True)


def _wait_for_steps(attacker, n, timeout=90, until=lambda: False):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until():
        r = attacker.envgit("log", "--remote", "ci", "--json")
        if r.returncode == 0 and len(json.loads(r.stdout)["steps"]) >= n:
            return True
        time.sleep(0.5)
    return False


def test_a_planted_envgit_package_never_runs_in_the_auto_push(attacker, s3, tmp_path):
    _remote(attacker, s3)
    marker = tmp_path / "pwned"
    tmp_path.chmod(0o777)
    payload = f"open({str(marker)!r}, 'w').write('{CANARY}')\n"
    attacker.run(
        "mkdir -p envgit/commands && "
        f"printf '%s' \"{payload}\" > envgit/__init__.py && cp envgit/__init__.py envgit/commands/__init__.py && "
        f"cp envgit/__init__.py envgit/commands/remote.py && cp envgit/__init__.py sitecustomize.py && "
        f"cp envgit/__init__.py usercustomize.py && cp envgit/__init__.py boto3.py", check=True)
    attacker.run("echo next > n.txt", check=True)
    pushed = _wait_for_steps(attacker, 2, until=marker.exists)
    assert not marker.exists(), "the project's code ran in the auto-push, outside the sandbox"
    assert pushed, "the auto-push never pushed the steps"


@pytest.mark.both_uids("the remote's key and configuration are the person's own files in their home: DAC does not "
                       "keep them from a non-root person's step, only the view must")
def test_a_step_cannot_read_the_remote_key_nor_redirect_the_push(attacker, s3):
    _remote(attacker, s3)
    conf = attacker.home / ".config/envgit/remotes"
    key = (conf / "ci.key").read_text().strip()
    before = (conf / "ci.json").read_bytes()
    r = attacker.run(
        "cat ~/.config/envgit/remotes/ci.key > leak.txt 2>&1; "
        f"cat {conf}/ci.key >> leak.txt 2>&1; cat leak.txt; "
        f"printf '%s' '{{\"url\": \"s3://evil/x\", \"endpoint\": \"http://127.0.0.1:9\", \"auto\": true}}' "
        f"> {conf}/ci.json; "
        "mkdir -p ~/.config/envgit/remotes && printf x > ~/.config/envgit/remotes/ci.json; true")
    assert key not in r.stdout + r.stderr
    assert key not in (attacker.root / "leak.txt").read_text()
    assert (conf / "ci.json").read_bytes() == before
    assert _wait_for_steps(attacker, 1)      # and the push still goes where the person said
