"""`envgit codex` as a person uses it: Codex's full-screen TUI on a real pseudo-terminal, a
prompt typed into it, the real Codex (pinned, from npm) against the scripted model server.
The typed prompt reaches the model, each shell call is a step carrying its call id, the answer
is on the screen, Ctrl-C ends it, and the terminal is left as it was found. Codex's own state
(its trust of the folder, the notices it showed, its sessions) is the person's: a second
session asks nothing the first one answered."""

import json
import os
import re
import signal

import pytest

from conftest import ENVGIT
from modelserver import CODEX_MODEL, AgentTerminal, Call, ModelServer, agent_bin, codex_config

PROMPT = "please look around 7c1f"
ANSWER = "the-answer-4e2a"
COMPOSER = "Ask Codex to do anything"
READY = f"{CODEX_MODEL.upper()} default"      # the status line, once Codex has loaded


@pytest.fixture(scope="session")
def codex_bin():
    return agent_bin("codex")


def shell(cmd, **more):
    return Call("exec_command", {"cmd": cmd, **more})


def codex_tui(proj, codex_bin, *args):
    return AgentTerminal([ENVGIT, "codex", *args], {**proj.env, "ENVGIT_CODEX_BIN": codex_bin}, proj.root)


def user_config(proj, model):
    """The person's ~/.codex/config.toml: the scripted provider and nothing Codex has written."""
    (proj.home / ".codex").mkdir(exist_ok=True)
    (proj.home / ".codex" / "config.toml").write_text(codex_config(model.url))


def first_run(t):
    """What Codex asks on its first run in a folder, answered as a person would: trust the
    folder; keep the configured model (the scripted server offers the tools of that one)."""
    t.answer("Trust this folder?", "\r", until="Use existing model")
    t.answer("Use existing model", "\x1b[B\r")


def ask(t, prompt=PROMPT):
    """Type the prompt (again if the composer did not show it: keys typed while the program
    still starts may be dropped), then Enter, and wait for the answer."""
    t.answer(READY, prompt, until=prompt)
    t.type("\r")
    t.wait_for(ANSWER)


def quit_with_ctrl_c(t):
    """Ctrl-C at an empty composer quits Codex (a second one if it asks for it)."""
    import subprocess
    t.type("\x03")
    try:
        return t.proc.wait(15)
    except subprocess.TimeoutExpired:
        t.type("\x03")
        return t.wait(60)


def codex_left_running(proj) -> list[str]:
    """Codex processes of this project still running (a background app server, its exec-server)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(proj.root) in cmd and ("app-server" in cmd or "execserver" in cmd):
            out.append(cmd)
    return out


def steps(proj):
    return json.loads(proj.envgit("log", "--json", check=True).stdout)


def test_a_typed_prompt_runs_shell_calls_as_steps_and_the_answer_is_shown(proj, codex_bin):
    script = [shell("mkdir -p sub && cd sub && pwd"),
              shell("pwd"),                                   # a new process: cd did not hold
              shell("pwd", workdir="sub")]                    # Codex's way to run elsewhere
    with ModelServer(script, final=ANSWER) as model:
        user_config(proj, model)
        with codex_tui(proj, codex_bin) as t:
            first_run(t)
            ask(t)
            assert quit_with_ctrl_c(t) == 0
            assert t.stty() == t.modes_before              # raw mode and the rest undone
    assert codex_left_running(proj) == []                   # no background server outlives it
    sent = [json.dumps(e.body) for e in model.main_requests()]
    assert sent and PROMPT in sent[0]                       # what was typed reached the model
    (c1, _, out1), (c2, _, out2), (c3, _, out3) = model.results()
    root = str(proj.root)
    # As in Codex without envgit: each exec_command is a process of its own, so a `cd` does
    # not carry over to the next call; `workdir` does choose the directory.
    assert out1.rstrip().endswith(root + "/sub"), out1
    assert out2.rstrip().endswith(root), out2
    assert out3.rstrip().endswith(root + "/sub"), out3
    got = [(s["argv"], s["tool_call_id"], s["cwd"], s["exit_code"]) for s in steps(proj)]
    assert got == [(["/bin/bash", "-lc", "mkdir -p sub && cd sub && pwd"], c1, root, 0),
                   (["/bin/bash", "-lc", "pwd"], c2, root, 0),
                   (["/bin/bash", "-lc", "pwd"], c3, root + "/sub", 0)]
    assert {s["session"] for s in steps(proj)} == {steps(proj)[0]["session"]}


def test_the_resume_hint_is_envgits_and_resumes_inside(proj, codex_bin):
    """Codex prints `codex resume ID` on exit, which would run outside envgit: envgit says
    `envgit codex resume ID` after it, and that brings the conversation back inside."""
    with ModelServer([], final=ANSWER) as model:
        user_config(proj, model)
        with codex_tui(proj, codex_bin) as t:
            first_run(t)
            ask(t)
            mark = t.mark()
            assert quit_with_ctrl_c(t) == 0
            t.drain()                   # envgit's hint is the last thing printed, after Codex's
            said = t.shown_after(mark)
        m = re.search(r"envgit codex resume ([0-9a-f-]{36})", said)
        assert m, said
        with codex_tui(proj, codex_bin, "resume", m.group(1)) as t:
            t.wait_for(PROMPT, timeout=60)                  # the conversation, back on the screen
            assert quit_with_ctrl_c(t) == 0


def test_a_killed_codex_leaves_the_terminal_as_it_was(proj, codex_bin):
    with ModelServer([], final=ANSWER) as model:
        user_config(proj, model)
        with codex_tui(proj, codex_bin) as t:
            first_run(t)
            t.wait_for(COMPOSER)
            assert t.stty() != t.modes_before              # Codex has the terminal in raw mode
            for pid in t.descendants():                   # kill -9 of Codex (its node wrapper
                os.kill(pid, signal.SIGKILL)              # and the binary), not of envgit
            assert t.wait(30) == 128 + signal.SIGKILL
            assert t.stty() == t.modes_before


def test_codex_state_persists_between_sessions_and_its_config_stays_out_of_reach(proj, codex_bin):
    (proj.root / ".codex").mkdir()
    (proj.root / ".codex" / "config.toml").write_text("# the project's Codex config\n")
    write_config = ("echo 'notify = [\"touch\", \"/tmp/pwned\"]' >> .codex/config.toml; echo project=$?; "
                    "echo 'notify = 1' >> ~/.codex/config.toml; echo home=$?; ls -a ~/.codex; "
                    "echo 'echo hi' > .envrc")                 # a route that did not exist: taken back
    with ModelServer([], final=ANSWER) as model:
        user_config(proj, model)
        with codex_tui(proj, codex_bin) as t:
            first_run(t)
            ask(t)
            assert quit_with_ctrl_c(t) == 0
    user_home = proj.home / ".codex"
    config = (user_home / "config.toml").read_text()
    assert f'[projects."{proj.root}"]' in config and 'trust_level = "trusted"' in config
    assert "hooks.state" not in config                       # envgit's hook trust is per run
    assert (user_home / "sessions").is_dir() and not (user_home / "sessions").is_symlink()
    assert PROMPT in (user_home / "history.jsonl").read_text()

    with ModelServer([shell(write_config)], final=ANSWER) as model:
        user_config_kept = (user_home / "config.toml").read_text()
        (user_home / "config.toml").write_text(user_config_kept.replace(
            [line for line in user_config_kept.splitlines() if line.startswith("base_url")][0],
            f'base_url = "{model.url}/v1"'))
        with codex_tui(proj, codex_bin) as t:
            ask(t, "second session")
            assert "Trust this folder?" not in t.text()         # asked once, in the first session
            assert "Use existing model" not in t.text()
            mark = t.mark()
            assert quit_with_ctrl_c(t) == 0
            assert t.stty() == t.modes_before
            # said to the person when Codex is done (the step's own notice went to the model)
            t.wait_for("envgit took them back", after=mark, timeout=10)
            assert ".envrc" in t.shown_after(mark)
    assert not (proj.root / ".envrc").exists()              # a route that did not exist: taken back
    (_, _, out), = model.results()
    assert "project=1" in out or "project=2" in out, out    # the project's .codex is read-only
    assert "home=1" in out or "home=2" in out, out          # and ~/.codex not even there
    assert (proj.root / ".codex" / "config.toml").read_text() == "# the project's Codex config\n"
    assert "notify" not in (user_home / "config.toml").read_text()
    assert not os.path.exists("/tmp/pwned")
    sessions = {s["session"] for s in steps(proj)}
    assert len(sessions) == 1                               # the second session's one step


def test_envgit_codex_outside_a_project_is_envgits_own_failure(tmp_path, proj, codex_bin):
    import subprocess
    r = subprocess.run([ENVGIT, "codex"], cwd=tmp_path, env={**proj.env, "ENVGIT_CODEX_BIN": codex_bin},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 125, r                           # as `envgit run` says its own failure
    assert r.stderr.startswith("envgit: ") and "envgit init" in r.stderr and r.stderr.count("\n") == 1
