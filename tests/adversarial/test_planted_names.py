"""Names planted where envgit later writes: a step (or an agent's own file tools) leaves a
symlink or a FIFO at the name of a temporary envgit writes beside a file (`FILE.tmp`,
`FILE.<pid>`), or at the file itself, in a directory it can write. envgit then writes as the
person, outside the sandbox: through the link into any file the person owns, or blocks on
the FIFO. Every such writer goes through atomicfile.write_atomic (a random O_EXCL|O_NOFOLLOW
temporary, renamed over the target); the red team's `export --html` case (round 14) is
test_export_html_tmp_file_symlink_overwrites_a_host_file.

Oracles: the person's file outside the project keeps its canary, or a marker a later step
writes (a hung writer never lets the step run)."""

import importlib.util
import io
import json
import os

from conftest import CANARY


def _victim(a, name="precious.txt"):
    v = a.home / name
    v.write_text(f"{CANARY} the person's own file\n")
    a.own(v)
    return v


def test_init_force_writes_through_no_planted_link(attacker):
    """`envgit init --force` rewrites envgit.yaml through `envgit.yaml.tmp` and appends to
    .gitignore: a step made both symlinks to the person's files outside the project."""
    a = attacker
    v1, v2 = _victim(a), _victim(a, "precious2.txt")
    before = v2.read_text()
    r = a.run("ln -s ../precious.txt envgit.yaml.tmp && rm -f .gitignore && "
              "ln -s ../precious2.txt .gitignore && echo planted")
    assert "planted" in r.stdout, r.stdout + r.stderr
    r = a.envgit("init", "--force")
    assert r.returncode == 0, r.stderr
    assert v1.read_text().startswith(CANARY), f"envgit.yaml.tmp written through: {v1.read_text()[:80]!r}"
    assert v2.read_text() == before, f".gitignore's link written through: {v2.read_text()!r}"
    assert not os.path.islink(a.root / "envgit.yaml") and "version:" in (a.root / "envgit.yaml").read_text()
    assert ".gitignore" in r.stderr and "not a regular file" in r.stderr, r.stderr


_NPMRC_CHILD = """
import sys
from envgit.policy import load_policy
from envgit.sandbox.environ import credential_env
env = credential_env(load_policy(sys.argv[1]), {}, sys.argv[2])
print(env["npm_config_userconfig"])
print(open(sys.argv[2] + "/.envgit-npmrc").read())
"""


def test_npm_credential_file_in_a_shared_tmp_is_not_opened_when_a_fifo_is_left(tmp_path):
    """With an npm credential the daemon writes `.envgit-npmrc` in the step's /tmp before
    each step. Under an agent whose own sandbox is alive, that /tmp is the session's, shared
    by the agent and all its commands (daemon/server.py step_tmp): a FIFO one left at the
    name blocked the daemon's write, and every later step, for good. The real daemon
    function, in a child bounded by a timeout (an agent session is not needed to reach it)."""
    import subprocess
    import sys
    policy = tmp_path / "envgit.yaml"
    policy.write_text("version: 1\ncredentials:\n  npm:\n    from: { env: NPM_TOKEN }\n"
                      "    hosts: [\"127.0.0.1:9\"]\n")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    os.mkfifo(tmp / ".envgit-npmrc")
    r = subprocess.run([sys.executable, "-c", _NPMRC_CHILD, str(policy), str(tmp)], timeout=20,
                       capture_output=True, text=True, env={**os.environ, "NPM_TOKEN": "npm_" + "x" * 36})
    assert r.returncode == 0, r.stderr
    assert "/tmp/.envgit-npmrc" in r.stdout and "_authToken=" in r.stdout, r.stdout
    assert not os.path.islink(tmp / ".envgit-npmrc")
    assert (os.stat(tmp / ".envgit-npmrc").st_mode & 0o777) == 0o600


def _plant(path_for_pid, target, pids):
    for p in pids:
        try:
            os.symlink(target, path_for_pid(p))
        except OSError:
            pass


def test_claude_config_merge_writes_through_no_planted_link(tmp_path):
    """Claude's own directory (CLAUDE_CONFIG_DIR) is Claude's to write: a link at the name
    the merge used (`.claude.json.envgit-<pid>`, kept across launches) pointed anywhere."""
    from envgit.agents import claude_config
    victim = tmp_path / "bashrc"
    victim.write_text(CANARY)
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    own, person = cfg / ".claude.json", tmp_path / "person.json"
    own.write_text('{"theme": "dark"}')
    person.write_text('{"oauthAccount": {"id": 1}}')
    _plant(lambda p: f"{own}.envgit-{p}", str(victim), [os.getpid()])
    claude_config._merge_config(str(person), str(own))
    assert victim.read_text() == CANARY
    assert json.loads(own.read_text()) == {"oauthAccount": {"id": 1}, "theme": "dark"}
    assert not own.is_symlink() and (own.stat().st_mode & 0o777) == 0o600


def test_claude_hook_writes_through_no_planted_link(tmp_path, monkeypatch):
    """ENVGIT_CLAUDE_CALLS stays writable to Claude's tools: the hook's `.<pid>.tmp` there."""
    import sys

    from envgit.agents import claude
    top, bin_dir, state = claude.write_scripts(sys.executable)
    calls = os.path.join(state, "calls")
    os.mkdir(calls)
    victim = tmp_path / "victim"
    victim.write_text(CANARY)
    _plant(lambda p: os.path.join(calls, f".{p}.tmp"), str(victim), [os.getpid()])
    monkeypatch.setenv("ENVGIT_CLAUDE_CALLS", calls)
    monkeypatch.syspath_prepend(bin_dir)
    spec = importlib.util.spec_from_file_location("claude_hook_copy", os.path.join(bin_dir, "claude_hook.py"))
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    hook.pre({"tool_use_id": "toolu_1", "tool_input": {"command": "ls"}})
    assert victim.read_text() == CANARY
    left = [n for n in os.listdir(calls) if not os.path.islink(os.path.join(calls, n))]
    assert len(left) == 1 and open(os.path.join(calls, left[0])).read() == "toolu_1", left


def test_codex_hook_writes_through_no_planted_link(tmp_path, monkeypatch):
    from envgit.agents import codex_hook
    victim = tmp_path / "victim"
    victim.write_text(CANARY)
    calls = tmp_path / "codex-current-call"
    _plant(lambda p: f"{calls}.{p}", str(victim), [os.getpid()])
    monkeypatch.setattr("sys.stdin", io.StringIO('{"tool_use_id": "call_7"}'))
    assert codex_hook.main([str(calls)]) == 0
    assert victim.read_text() == CANARY
    assert calls.read_text() == "call_7" and not calls.is_symlink()


def _pid_max() -> int:
    try:
        return int(open("/proc/sys/kernel/pid_max").read())
    except (OSError, ValueError):
        return 32768


def test_export_html_tmp_file_symlink_overwrites_a_host_file(attacker):
    """The red team's case (round 14): `envgit export --html FILE` wrote its report to
    `FILE.envgit-tmp-PID` first, opened with plain open(..., "w"), which follows a symlink. A
    step cannot know the pid, but pids are small (pid_max is 32768 on most machines): it plants
    a symlink for every pid beside the name the help text suggests (`report.html`), each
    pointing at a file of the person's outside the project. When the person later exported the
    report into the project, the report's text was written THROUGH the symlink (the person's
    file truncated and overwritten: any file the person can write, e.g. ~/.bashrc or
    ~/.ssh/authorized_keys), and the rename then put the symlink at report.html, so the report
    still opened and nothing looked wrong. Oracle: the person's file outside the project, which
    no step may write, keeps its canary."""
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
