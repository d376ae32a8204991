"""Policy files that stalled the daemon (issue 11, item 11): a 20 MB envgit.yaml (18 s of every
step), 200,000 deny_read entries (350 s for the first step), a 5 MB shell.deny pattern (minutes
of CPU per step). The policy is refused with its file:line past fixed limits (schema.py), parsed
once per change in a thread (server.py), its list merge linear and its shell patterns split
once (load.py, decide.py). A policy at the limits still runs steps promptly, and fixing the
file makes the next step work."""

import time

import pytest

from envgit.policy.schema import MAX_BYTES, MAX_ITEMS, MAX_TEXT
from faultlib import no_traceback

GOOD = "version: 1\n"


def deny_read(n, prefix="/srv/data"):
    return "version: 1\nfilesystem:\n  deny_read:\n" + "".join(f"    - {prefix}/d{i}/secret\n" for i in range(n))


CASES = {
    "20 MB file": ("version: 1\nfilesystem:\n  deny_read:\n" + "    - /srv/x\n" * (20 * 1024 * 1024 // 12),
                   f"a policy is at most {MAX_BYTES} bytes"),
    "200,000 deny_read entries": (None, "at most"),          # past the byte limit as well
    "5,000 deny_read entries": (deny_read(5000, "/s"), f"has 5000 entries; at most {MAX_ITEMS}"),
    "5 MB shell pattern": ('version: 1\nshell:\n  - deny: ["' + "rm -rf " * (5 * 1024 * 1024 // 7) + '"]\n',
                           f"a policy is at most {MAX_BYTES} bytes"),
    "30,000-character shell pattern": ('version: 1\nshell:\n  - deny: ["' + "rm " * 10000 + '"]\n',
                                      f"at most {MAX_TEXT}"),
    "unbalanced quote in a shell pattern": ('version: 1\nshell:\n  - deny: ["rm \'x"]\n', "close the quote"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_policy_past_the_limits_is_refused_at_once_with_its_line(bare_proj, case):
    proj = bare_proj
    text, said = CASES[case]
    if text is None:
        text = deny_read(200_000)
    assert proj.run("true").returncode == 0          # a daemon already running, with a good policy
    proj.write_policy(text)
    for argv in (["run", "--", "true"], ["policy", "check"]):
        t = time.monotonic()
        r = no_traceback(proj.envgit(*argv, timeout=60))
        assert time.monotonic() - t < 10, f"{case}: {argv} took {time.monotonic() - t:.1f} s"
        assert r.returncode == (125 if argv[0] == "run" else 2) and said in r.stderr, r.stderr
        line = r.stderr.strip().splitlines()[-1]
        assert line.startswith("envgit: ") and "envgit.yaml:" in line     # file:line
        assert int(line.split("envgit.yaml:", 1)[1].split(":", 1)[0]) > 0
    proj.write_policy(GOOD)                           # fixed: the next step works
    assert proj.run("echo ok").returncode == 0


def test_a_policy_at_the_limits_runs_steps_promptly(bare_proj):
    proj = bare_proj
    patterns = ", ".join(f'"tool{i} ' + "x" * 30 + '"' for i in range(200))
    proj.write_policy(deny_read(MAX_ITEMS - 50) + f"shell:\n  - deny: [{patterns}, \"git push\"]\n")
    assert len((proj.root / "envgit.yaml").read_bytes()) < MAX_BYTES
    r = no_traceback(proj.run("true", timeout=120))          # the first step parses it
    assert r.returncode == 0, r.stderr
    took = []
    for _ in range(3):
        t = time.monotonic()
        assert proj.run("echo ok").returncode == 0
        took.append(time.monotonic() - t)
    assert sorted(took)[1] < 5, took
    r = proj.envgit("run", "--", "git", "push", "origin")
    assert r.returncode == 126 and "git push" in r.stderr     # the rules still apply
