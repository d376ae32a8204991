"""Red team, round 14: `envgit export --html FILE` writes its report to `FILE.envgit-tmp-PID`
first, opened with plain open(..., "w"), which follows a symlink. A step cannot know the
pid, but pids are small (pid_max is 32768 on most machines): it plants a symlink for every
pid beside the name the help text suggests (`report.html`), each pointing at a file of the
person's outside the project. When the person later exports the report into the project,
the report's text is written THROUGH the symlink (the person's file is truncated and
overwritten: any file the person can write, e.g. ~/.bashrc or ~/.ssh/authorized_keys), and
the rename then puts the symlink at report.html, so the report still opens and nothing
looks wrong.

Oracle: the person's file outside the project, which no step may write, no longer holds
its canary."""

import os

from harness import CANARY, attacker  # noqa: F401  (the fixture)


def _pid_max() -> int:
    try:
        return int(open("/proc/sys/kernel/pid_max").read())
    except (OSError, ValueError):
        return 32768


def test_export_html_tmp_file_symlink_overwrites_a_host_file(attacker):
    a = attacker
    victim = a.home / "precious.txt"              # outside the project: no step may write it
    victim.write_text(f"{CANARY} the person's own file\n")
    a.own(victim)
    # The step: a symlink for every pid the export could get, beside the report's name.
    # Relative target: the project is ~/proj, so ../precious.txt is the person's file.
    n = min(_pid_max(), 65536)
    plant = ("python3 -c 'import os\n"
             f"for p in range(1, {n + 1}):\n"
             "    try: os.symlink(\"../precious.txt\", \"report.html.envgit-tmp-%d\" % p)\n"
             "    except OSError: pass\n'")
    r = a.run(plant + " && echo planted", timeout=300)
    assert "planted" in r.stdout, r.stdout + r.stderr
    assert victim.read_text().startswith(CANARY)  # the step itself could not write it
    # Later, the person exports the session's report into the project (as --help shows).
    r = a.envgit("export", "--html", "report.html", timeout=300)
    assert r.returncode == 0, r.stderr
    assert victim.read_text().startswith(CANARY), (
        "envgit export --html wrote its report through a symlink a step planted: the person's "
        f"file outside the project now holds: {victim.read_text()[:120]!r}")
    assert not os.path.islink(a.root / "report.html")
