"""`envgit claude` as a person uses it: Claude Code's full-screen UI on a real pseudo-terminal,
answered and typed into, the real Claude Code (pinned, from npm) against the scripted model
server, which it reaches only through the network gate. The typed prompt reaches the model,
each Bash call is a step with its tool-call id, the answer is on the screen, /exit and Ctrl-C
end it and the terminal is left as it was found; a `cd` holds from one Bash call to the next,
as in Claude Code alone; Claude's own state persists, so a second session asks nothing; two
Bash calls in one answer keep their own ids.

Claude authenticates with ANTHROPIC_AUTH_TOKEN (as with a gateway): with an API key, a first
run checks it can reach api.anthropic.com before anything else, which nothing here can."""

import json
import re
import shutil
import signal
import time

import pytest

from conftest import ENVGIT
from modelserver import AgentTerminal, Call, ModelServer, Parallel, agent_bin, claude_env

MODEL_HOST = "model.example.test"
PROMPT = "please run the commands 5e1f"
ANSWER = "the-answer-7c2a"
READY = "shift+tab to cycle"          # the permission-mode line under Claude's prompt box

pytestmark = pytest.mark.skipif(shutil.which("socat") is None,
                                reason="socat is not installed (Claude reaches its model only through the gate)")


@pytest.fixture(scope="session")
def claude_bin():
    return agent_bin("claude")


@pytest.fixture
def cproj(proj):
    proj.env["ENVGIT_RESOLVE"] = f"{MODEL_HOST}=127.0.0.1"
    return proj


def bash(cmd):
    return Call("Bash", {"command": cmd, "description": "scripted"})


def policy(model):
    return f'version: 1\nnetwork:\n  allow: ["{MODEL_HOST}:{model.port}"]\n'


def claude_tui(proj, claude_bin, model, *args):
    env = {**proj.env, **claude_env(f"http://{MODEL_HOST}:{model.port}"), "ENVGIT_CLAUDE_BIN": claude_bin,
           "ANTHROPIC_AUTH_TOKEN": "scripted"}
    env.pop("ANTHROPIC_API_KEY")
    # Bash allowed up front: the calls run without a permission question (auto mode would ask
    # the model to judge each one)
    return AgentTerminal([ENVGIT, "claude", "--allowedTools", "Bash", *args], env, proj.root)


STARTUP = ("Choose the text style", "Security notes", "Yes, I trust this folder")


def first_run(t):
    """Claude's start-up questions, answered: the theme, the security notes, the folder's trust
    (its default is "No, exit": down, then Enter)."""
    t.answer(STARTUP[0], "\r")
    t.answer(STARTUP[1], "\r")
    t.wait_for(STARTUP[2])
    t.wait_for("Enter to confirm")

    def chosen():                       # the cursor (❯) on the "Yes" line
        return any(STARTUP[2] in line and "❯" in line for line in t.screen().splitlines())
    for _ in range(4):
        time.sleep(1)                   # a key typed while the dialog still starts is dropped;
        t.type("\x1b[B")               # two taken at once would go round to "No, exit"
        stop = time.monotonic() + 10
        while not chosen() and time.monotonic() < stop:
            time.sleep(0.1)
        if chosen():
            break
    assert chosen(), t.screen()
    t.answer(STARTUP[2], "\r")


def ask(t, prompt=PROMPT, answer=ANSWER):
    """Type the prompt once the prompt box is there (again if the box did not show it: keys
    typed while Claude still starts may be dropped), Enter, and wait for the answer."""
    t.wait_for(READY)
    for _ in range(3):
        t.type(prompt)
        deadline = time.monotonic() + 8
        while prompt not in t.screen() and time.monotonic() < deadline:
            time.sleep(0.2)
        if prompt in t.screen():
            break
    t.type("\r")
    t.wait_for(answer, timeout=120)


def exit_command(t):
    t.type("/exit")
    time.sleep(1)                      # the command list opens under what is typed
    t.type("\r")
    return t.wait(60)


def steps(proj):
    return json.loads(proj.envgit("log", "--json", check=True).stdout)


def test_a_typed_prompt_runs_bash_calls_as_steps_and_a_cd_holds(cproj, claude_bin):
    (cproj.root / "sub").mkdir()
    with ModelServer([bash("cd sub && echo moved"), bash("pwd")], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            ask(t)
            assert ANSWER in t.screen()                     # the answer, rendered
            # what the gate says meanwhile (Claude tries hosts of its own) waits for the exit:
            # never drawn over Claude's screen
            assert "envgit: step" not in t.text().split("its steps: envgit log", 1)[1]
            mark = t.mark()
            assert exit_command(t) == 0
            assert t.stty() == t.modes_before
            t.drain()                   # what envgit says after Claude's exit, read whole
            said_after = t.shown_after(mark)
    sent = [json.dumps(e.body) for e in model.main_requests()]
    assert sent and PROMPT in sent[0]                        # what was typed reached the model
    (c1, _, out1), (c2, _, out2) = model.results()
    sub = str(cproj.root / "sub")
    assert out1.strip() == "moved" and out2.strip() == sub, (out1, out2)
    session, *calls = steps(cproj)
    assert [(s["argv"], s["cwd"], s["tool_call_id"], s["exit_code"]) for s in calls] == [
        (["bash", "-c", "cd sub && echo moved"], str(cproj.root), c1, 0),
        (["bash", "-c", "pwd"], sub, c2, 0)]                 # the second call started in sub/
    assert "agent-session" in session["marks"] and session["exit_code"] == 0
    if "denied-net" in session["marks"]:                     # said, once Claude had exited
        assert "not in network.allow" in said_after, said_after


def test_a_failed_command_leaves_the_directory_as_claude_alone_does(cproj, claude_bin):
    """Claude runs `eval CMD && pwd -P >| FILE`: a command that fails does not move it."""
    (cproj.root / "sub").mkdir()
    with ModelServer([bash("cd sub && false"), bash("pwd")], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            ask(t)
            assert exit_command(t) == 0
    (_, _, out2) = model.results()[1]
    assert out2.strip() == str(cproj.root), out2


def test_ctrl_c_ends_claude_and_the_terminal_is_restored(cproj, claude_bin):
    with ModelServer([], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            t.wait_for(READY)
            assert t.stty() != t.modes_before               # Claude has the terminal in raw mode
            status = None
            for _ in range(10):                             # Ctrl-C twice, as Claude asks
                t.type("\x03")
                time.sleep(0.3)
                t.type("\x03")
                try:
                    status = t.proc.wait(2)
                    break
                except Exception:
                    pass
            assert status == 0, t.screen()
            assert t.stty() == t.modes_before
    session, = steps(cproj)
    assert session["exit_code"] == 0 and "agent-session" in session["marks"]


def test_esc_during_a_long_bash_call_ends_the_command(cproj, claude_bin):
    """Esc on a running Bash call: Claude says it was interrupted, and the command under envgit
    ends too (as it does under plain claude), within seconds; the oracle is the file the command
    writes after its sleep, which never appears. The step says how it ended."""
    cmd = "echo started; sleep 8; echo finished > late.txt"
    with ModelServer([bash(cmd)], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            t.wait_for(READY)
            t.type(PROMPT)
            time.sleep(0.5)
            t.type("\r")
            deadline = time.monotonic() + 120
            running = []
            while not running and time.monotonic() < deadline:
                running = [s for s in steps(cproj) if s["argv"] == ["bash", "-c", cmd] and s["status"] == "running"]
                time.sleep(0.2)
            assert running, t.screen()
            started = time.monotonic()
            t.type("\x1b")
            t.wait_for("Interrupted", timeout=30)
            ended = []
            # looked at at least once however long "Interrupted" took to show on a loaded
            # machine (a bound from the Esc could pass before the first look); the late file
            # below is the oracle of the command's end in time
            while not ended and time.monotonic() - started < 30:
                ended = [s for s in steps(cproj) if s["id"] == running[0]["id"] and s["status"] != "running"]
                time.sleep(0.2)
            assert ended and "interrupted-by-agent" in ended[0]["marks"], (ended, t.screen())
            time.sleep(max(0.0, 10 - (time.monotonic() - started)))
            assert not (cproj.root / "late.txt").exists()
            assert exit_command(t) == 0
            assert t.stty() == t.modes_before


def test_the_resume_hint_is_envgits_and_resumes_inside(cproj, claude_bin):
    """Claude prints `claude --resume ID` on exit, which would run outside envgit: envgit says
    `envgit claude --resume ID` after it, and that brings the conversation back inside."""
    with ModelServer([], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            ask(t)
            mark = t.mark()
            assert exit_command(t) == 0
            t.drain()                   # envgit's hint is the last thing printed, after Claude's
            said = t.shown_after(mark)
        m = re.search(r"envgit claude --resume ([0-9a-f-]{36})", said)
        assert m, said
        with claude_tui(cproj, claude_bin, model, "--resume", m.group(1)) as t:
            t.wait_for(READY)
            t.wait_for(PROMPT, timeout=30)                  # the conversation, back on the screen
            assert exit_command(t) == 0
    sessions = [s for s in steps(cproj) if "agent-session" in s["marks"]]
    assert [s["argv"][3:] for s in sessions] == [[], ["--resume", m.group(1)]]      # after --allowedTools Bash


def test_claudes_state_persists_so_a_second_session_asks_nothing(cproj, claude_bin):
    with ModelServer([], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            ask(t)
            assert exit_command(t) == 0
    state = cproj.home / ".claude"
    settings = state / "settings.json"
    settings.write_text('{"env": {"FROM_THE_PERSON": "1"}}\n')
    with ModelServer([bash("echo second-session-ran")], final="second-answer") as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            ask(t, "second session", "second-answer")       # straight to the prompt
            assert exit_command(t) == 0
            assert t.stty() == t.modes_before
            shown = t.text()
    for question in STARTUP:
        assert question not in shown, question
    (_, _, out), = model.results()
    assert "second-session-ran" in out, out
    assert settings.read_text() == '{"env": {"FROM_THE_PERSON": "1"}}\n'   # the person's, as it was
    assert not (cproj.home / ".claude.json").exists()         # the person's own: never written inside
    assert any((state / "projects").rglob("*.jsonl"))         # the transcripts: where --resume looks


def test_parallel_bash_calls_keep_their_own_ids(cproj, claude_bin):
    a = bash("sleep 1; echo first-call-out")
    b = bash("echo second-call-out")
    with ModelServer([Parallel([a, b])], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            ask(t)
            assert exit_command(t) == 0
    (ca, _, _), (cb, _, _) = model.calls
    assert "first-call-out" in model.result_of(ca) and "second-call-out" not in model.result_of(ca)
    assert "second-call-out" in model.result_of(cb) and "first-call-out" not in model.result_of(cb)
    by_id = {s["tool_call_id"]: s["argv"] for s in steps(cproj)[1:]}
    assert by_id == {ca: ["bash", "-c", a.input["command"]], cb: ["bash", "-c", b.input["command"]]}


def test_claudes_config_dir_keeps_the_persons_config_read_only(cproj, claude_bin):
    """Claude's own config directory (CLAUDE_CONFIG_DIR) links to ~/.claude's entries: through
    it Claude's Write tool meets the same read-only mounts, and whatever it leaves there (a file
    over a link, a new name) is gone at the next launch, never read as settings."""
    from test_agents_claude import run_claude
    state = cproj.home / ".claude"
    (state / "hooks").mkdir(parents=True)
    (state / "settings.json").write_text("{}\n")
    (state / "CLAUDE.md").write_text("the person's\n")
    hooks = {"hooks": {"SessionStart": [{"hooks": [{"type": "command", "command": "touch /tmp/x"}]}]}}
    with ModelServer([]) as model:                       # the first launch makes the directory
        cproj.write_policy(policy(model))
        assert run_claude(cproj, claude_bin, model).returncode == 0
    cfg, = (cproj.home / ".local" / "state" / "envgit" / "claude").iterdir()
    assert (cfg / ".claude.json").is_file() and (cfg / "settings.json").is_symlink()
    targets = [cfg / "settings.json", cfg / "CLAUDE.md", cfg / "hooks" / "h.sh", cfg / "newname.json"]
    with ModelServer([Call("Write", {"file_path": str(p), "content": json.dumps(hooks)}) for p in targets]) as model:
        cproj.write_policy(policy(model))
        assert run_claude(cproj, claude_bin, model).returncode == 0
    assert (state / "settings.json").read_text() == "{}\n"
    assert (state / "CLAUDE.md").read_text() == "the person's\n"
    assert not (state / "hooks" / "h.sh").exists()
    assert (cfg / "newname.json").exists()               # the directory itself is Claude's to write
    with ModelServer([]) as model:                       # a launch clears what was left
        cproj.write_policy(policy(model))
        assert run_claude(cproj, claude_bin, model).returncode == 0
    assert (cfg / "settings.json").is_symlink() and not (cfg / "newname.json").exists()
    assert (cfg / "CLAUDE.md").is_symlink() and (cfg / "hooks").is_symlink()


def test_the_inner_run_op_takes_a_cwd_file_only_in_tmp_and_with_bash_c():
    from envgit.daemon.inner import BadRequest, check_request, tracking_cwd
    ok = {"op": "run", "argv": ["bash", "-c", "cd sub"], "cwd": "/", "env": {}, "cwd_file": "/tmp/claude-1-cwd"}
    assert check_request(ok, "/")["cwd_file"] == "/tmp/claude-1-cwd"
    for bad in ({**ok, "cwd_file": "/home/x/cwd"}, {**ok, "cwd_file": "/tmp/a/b"}, {**ok, "cwd_file": "/tmp/.."},
                {**ok, "argv": ["sh", "-c", "cd sub"]}, {**ok, "argv": ["bash", "-c", "x", "y"]}):
        with pytest.raises(BadRequest):
            check_request(bad, "/")
    assert tracking_cwd(["bash", "-c", "cd 'a b'"], "/tmp/f") == \
        ["bash", "-c", "eval 'cd '\"'\"'a b'\"'\"'' && pwd -P >| /tmp/f"]


def test_the_shim_takes_the_id_left_for_its_own_command(tmp_path, monkeypatch):
    """Each Bash call's id is taken once, by the shim running that command: the newest left
    for it (an older one is a call refused before it ran), else the only one waiting."""
    from envgit.agents.claude_shim import call_key, take_call
    monkeypatch.setenv("ENVGIT_CLAUDE_CALLS", str(tmp_path))
    for name, cid in ((f"{call_key('ls')}.5", "refused-ls"), (f"{call_key('ls')}.9", "ls-id"),
                      (f"{call_key('pwd')}.7", "pwd-id")):
        (tmp_path / name).write_text(cid)
    assert take_call("pwd") == "pwd-id" and take_call("ls") == "ls-id"
    assert take_call("ls -l") == "refused-ls"          # reworded: the only one left
    assert take_call("ls") is None and not list(tmp_path.iterdir())


def test_a_killed_claude_leaves_the_terminal_as_it_was(cproj, claude_bin):
    import os
    with ModelServer([], final=ANSWER) as model:
        cproj.write_policy(policy(model))
        with claude_tui(cproj, claude_bin, model) as t:
            first_run(t)
            t.wait_for(READY)
            assert t.stty() != t.modes_before               # raw mode, Claude's
            for pid in t.descendants():                     # kill -9 of Claude, not of envgit
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:                  # a short-lived child already gone
                    pass
            assert t.wait(30) == 128 + signal.SIGKILL
            assert t.stty() == t.modes_before


def test_a_first_launch_offers_the_model_host_the_policy_lacks_and_then_reaches_it(cproj, claude_bin):
    """The policy does not name the model's host: before Claude's UI starts, envgit names it
    and offers to add it; accepted, envgit.yaml has it and Claude reaches its model."""
    with ModelServer([bash("echo offered")], final=ANSWER) as model:
        cproj.write_policy("version: 1\nnetwork:\n  allow: []\n")
        with claude_tui(cproj, claude_bin, model) as t:
            t.answer("add them to network.allow now? [y/N]", "y\r")
            t.wait_for("added")
            first_run(t)
            ask(t)
            assert exit_command(t) == 0
            shown = t.text()
    assert f"{MODEL_HOST}:{model.port}" in shown and "its model API" in shown
    assert f'"{MODEL_HOST}:{model.port}"' in (cproj.root / "envgit.yaml").read_text()
    assert [out.strip() for _, _, out in model.results()] == ["offered"]
