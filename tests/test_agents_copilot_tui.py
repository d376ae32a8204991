"""`envgit copilot` as a person uses it: the Copilot CLI's interactive UI on a real
pseudo-terminal, a prompt typed into it, the real Copilot (pinned, from npm, offline) against
the scripted model server. The typed prompt reaches the model, each bash call is a step, the
answer is on the screen, Ctrl-C ends it, and the terminal is left as it was found. Copilot's
own state (the folders it was told to trust, its sessions) is the person's ~/.copilot: a
second session does not ask again."""

import json
import os
import signal

import pytest

from conftest import ENVGIT
from modelserver import AgentTerminal, Call, ModelServer, agent_bin, copilot_env

PROMPT = "please look around 3b9d"
ANSWER = "the-answer-8d1c"
READY = "? help"                     # the status line under Copilot's prompt


@pytest.fixture(scope="session")
def copilot_bin():
    return agent_bin("copilot")


def bash(cmd):
    return Call("bash", {"command": cmd, "description": "scripted"})


def copilot_tui(proj, copilot_bin, model):
    return AgentTerminal([ENVGIT, "copilot"], {**proj.env, **copilot_env(model.url),
                                               "ENVGIT_COPILOT_BIN": copilot_bin}, proj.root)


def trust_and_remember(t):
    """Copilot's first question in a folder, answered "Yes, and remember this folder"."""
    t.answer("Do you trust the files in this folder?", "\x1b[B\r", until="added to trusted folders")


def ask(t, prompt=PROMPT):
    """Type the prompt (again if the composer did not show it: keys typed while the program
    still starts may be dropped), then Enter, and wait for the answer."""
    t.answer(READY, prompt, until=prompt)
    t.type("\r")
    t.wait_for(ANSWER)


def quit_with_ctrl_c(t):
    """Ctrl-C twice, as Copilot asks ("ctrl+c again to exit"); a Ctrl-C that lands while it is
    still closing the turn cancels that instead, so press on, a second apart, until it exits."""
    import subprocess
    for _ in range(10):
        t.type("\x03")
        try:
            return t.proc.wait(1)
        except subprocess.TimeoutExpired:
            pass
    return t.wait(60)


def steps(proj):
    return json.loads(proj.envgit("log", "--json", check=True).stdout)


def test_a_typed_prompt_runs_bash_calls_as_steps_and_the_answer_is_shown(proj, copilot_bin):
    script = [bash("mkdir -p sub && cd sub && pwd"), bash("pwd")]
    with ModelServer(script, final=ANSWER) as model:
        with copilot_tui(proj, copilot_bin, model) as t:
            trust_and_remember(t)
            ask(t)
            assert quit_with_ctrl_c(t) == 0
            assert t.stty() == t.modes_before
    sent = [json.dumps(e.body) for e in model.main_requests()]
    assert sent and PROMPT in sent[0]                       # what was typed reached the model
    (c1, _, out1), (c2, _, out2) = model.results()
    root = str(proj.root)
    # As in Copilot without envgit: each bash call is a shell of its own (shellId 0, 1), so
    # a `cd` does not carry over to the next call.
    assert out1.startswith(root + "/sub\n"), out1
    assert out2.startswith(root + "\n"), out2
    got = [(s["argv"], s["cwd"], s["exit_code"]) for s in steps(proj)]
    assert got == [(["bash", "-c", "mkdir -p sub && cd sub && pwd"], root, 0),
                   (["bash", "-c", "pwd"], root, 0)]
    session, = {s["session"] for s in steps(proj)}
    assert session.startswith("copilot-")


def test_a_killed_copilot_leaves_the_terminal_as_it_was(proj, copilot_bin):
    with ModelServer([], final=ANSWER) as model:
        with copilot_tui(proj, copilot_bin, model) as t:
            trust_and_remember(t)
            t.wait_for(READY)
            assert t.stty() != t.modes_before              # Copilot has the terminal in raw mode
            for pid in t.descendants():                   # kill -9 of Copilot, not of envgit
                os.kill(pid, signal.SIGKILL)
            assert t.wait(30) == 128 + signal.SIGKILL
            assert t.stty() == t.modes_before


def test_copilot_state_persists_between_sessions_and_its_config_stays_out_of_reach(proj, copilot_bin):
    hooks = proj.root / ".github" / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "project.json").write_text('{"version": 1, "hooks": {}}\n')
    with ModelServer([], final=ANSWER) as model:
        with copilot_tui(proj, copilot_bin, model) as t:
            trust_and_remember(t)
            ask(t)
            assert quit_with_ctrl_c(t) == 0
    state = proj.home / ".copilot"
    remembered = [p for p in state.glob("*.json") if str(proj.root) in p.read_text()]
    assert remembered, sorted(p.name for p in state.iterdir())   # the trust, in ~/.copilot
    settings = {p: p.read_text() for p in state.glob("*.json")}

    write = ("echo '{\"version\": 1, \"hooks\": {\"sessionStart\": [{\"type\": \"command\", "
             "\"bash\": \"touch /tmp/pwned\"}]}}' > .github/hooks/project.json; echo project=$?; "
             "echo x >> ~/.copilot/settings.json; echo home=$?; ls -a ~/.copilot; "
             "echo 'echo hi' > .envrc")                         # a route that did not exist: taken back
    with ModelServer([bash(write)], final=ANSWER) as model:
        with copilot_tui(proj, copilot_bin, model) as t:
            ask(t, "second session")
            assert "Do you trust the files in this folder?" not in t.text()
            mark = t.mark()
            assert quit_with_ctrl_c(t) == 0
            assert t.stty() == t.modes_before
            # said to the person when Copilot is done (the step's own notice went to the model)
            t.wait_for("envgit took them back", after=mark, timeout=10)
            assert ".envrc" in t.shown_after(mark)
    assert not (proj.root / ".envrc").exists()              # a route that did not exist: taken back
    (_, _, out), = model.results()
    assert "project=1" in out or "project=2" in out, out    # the project's hooks: read-only
    assert "home=1" in out or "home=2" in out, out          # ~/.copilot: not there at all
    assert (hooks / "project.json").read_text() == '{"version": 1, "hooks": {}}\n'
    for path, text in settings.items():
        assert "x\n" not in path.read_text()[len(text):]
    assert not os.path.exists("/tmp/pwned")


def test_envgit_copilot_outside_a_project_is_envgits_own_failure(tmp_path, proj, copilot_bin):
    import subprocess
    r = subprocess.run([ENVGIT, "copilot"], cwd=tmp_path, env={**proj.env, "ENVGIT_COPILOT_BIN": copilot_bin},
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 125, r                           # as `envgit run` says its own failure
    assert r.stderr.startswith("envgit: ") and "envgit init" in r.stderr and r.stderr.count("\n") == 1
