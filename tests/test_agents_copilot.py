"""`envgit copilot`: the real Copilot CLI (pinned, from npm), offline, against the scripted
model server. Its bash calls are routed through envgit by a preToolUse hook; its own file
tools are checked against the policy before they run and recorded after."""

import json
import shutil
import subprocess

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from modelserver import Call, ModelServer, agent_bin, agent_command, clone_for_push, copilot_env


@pytest.fixture(scope="session")
def copilot_bin():
    return agent_bin("copilot")


def run_copilot(env: Env, copilot_bin, script, prompt="go", timeout=240):
    with ModelServer(script) as model:
        r = subprocess.run([*agent_command(ENVGIT, "copilot"), "-p", prompt, "--allow-all-tools"],
                           cwd=env.root, env={**env.env, **copilot_env(model.url),
                                              "ENVGIT_COPILOT_BIN": copilot_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return r, model


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def bash(cmd):
    return Call("bash", {"command": cmd, "description": "scripted"})


def test_bash_calls_and_edits_are_steps_in_order(proj, copilot_bin):
    path = str(proj.root / "notes.txt")
    r, model = run_copilot(proj, copilot_bin, [
        bash("echo from-the-model"),
        Call("create", {"path": path, "file_text": "first line\n"}),
        bash("wc -l notes.txt"),
    ])
    assert r.returncode == 0, r.stderr
    (_, _, out1), (_, _, out2), (_, _, out3) = model.results()
    assert "from-the-model" in out1 and "1 notes.txt" in out3
    got = [s["argv"] for s in steps(proj)]
    assert got == [["bash", "-c", "echo from-the-model"], ["copilot:create", path],
                   ["bash", "-c", "wc -l notes.txt"]]
    edit = steps(proj)[1]
    assert "agent-edit" in edit["marks"]
    assert {"path": "notes.txt", "status": "added"} in edit["snapshot"]["paths"]
    sessions = {s["session"] for s in steps(proj)}
    assert len(sessions) == 1 and sessions.pop().startswith("copilot-")


def test_an_edit_can_be_rewound(proj, copilot_bin):
    (proj.root / "app.py").write_text("print('one')\n")
    proj.run("true")                                  # step 1: the tree before the edit
    r, model = run_copilot(proj, copilot_bin, [
        Call("edit", {"path": str(proj.root / "app.py"), "old_str": "one", "new_str": "two"}),
    ])
    assert r.returncode == 0, r.stderr
    assert (proj.root / "app.py").read_text() == "print('two')\n"
    edit = steps(proj)[-1]
    assert edit["argv"][0] == "copilot:edit"
    assert {"path": "app.py", "status": "modified"} in edit["snapshot"]["paths"]
    proj.envgit("rewind", "1", "--yes", check=True)
    assert (proj.root / "app.py").read_text() == "print('one')\n"


def test_reading_the_ssh_key_through_the_file_tool_is_refused(proj, copilot_bin):
    key = str(proj.home / ".ssh" / "id_ed25519")
    r, model = run_copilot(proj, copilot_bin, [
        Call("view", {"path": key}),
        bash(f"cat {key}"),
    ])
    assert r.returncode == 0, r.stderr
    (_, _, view), (_, _, cat) = model.results()
    assert "deny_read ~/.ssh" in view, view
    # the Bash call read the key's placeholder, and the tool result carries envgit's line
    assert "~/.ssh/id_ed25519 is hidden from steps by filesystem.deny_read '~/.ssh'" in cat, cat
    assert CANARY not in json.dumps([e.body for e in model.log])


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed (the network gate needs it)")
def test_push_behind_a_variable_is_refused_at_the_request(tmp_path, remote, copilot_bin):
    home = make_home(tmp_path)
    env = Env(home, home / "app", {"ENVGIT_RESOLVE": remote.resolve,
                                   "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    clone_for_push(env, remote)
    try:
        before = remote.refs()
        r, model = run_copilot(env, copilot_bin, [
            bash("echo change >> README && git commit -qam change"),
            bash("g=git; $g push origin main"),
        ])
        assert r.returncode == 0, r.stderr
        (_, _, pushed), = model.results()[1:]
        assert "[remote rejected]" in pushed and "preset:default/git-push" in pushed, pushed
        assert remote.refs() == before
        push = steps(env)[-1]
        assert push["argv"] == ["bash", "-c", "g=git; $g push origin main"] and push["exit_code"] != 0
        assert any(q["decision"] == "deny" and "git-receive-pack" in q["path"] for q in push["requests"])
    finally:
        env.stop()
