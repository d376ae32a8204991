"""`envgit codex`: the real Codex (pinned, from npm) driven by the scripted model server on
127.0.0.1, with envgit as its exec-server. Every shell command and every file operation of
the model's tool calls must be a step of the one session, carrying the tool-call id."""

import json
import shutil
import subprocess

import pytest

from conftest import CANARY, ENVGIT, Env, make_home
from kit.git_remote import git_remote  # noqa: F401  (the fixture `remote`)
from modelserver import Call, ModelServer, agent_bin, agent_command, clone_for_push, codex_config


@pytest.fixture(scope="session")
def codex_bin():
    return agent_bin("codex")


def run_codex(env: Env, codex_bin, script, prompt="go", timeout=240):
    """Codex under envgit, one `codex exec` turn replaying `script`: (process, model server)."""
    codex_home = env.home / ".codex"
    codex_home.mkdir(exist_ok=True)
    with ModelServer(script) as model:
        (codex_home / "config.toml").write_text(codex_config(model.url))
        r = subprocess.run([*agent_command(ENVGIT, "codex"), "exec", "--skip-git-repo-check", prompt],
                           cwd=env.root, env={**env.env, "ENVGIT_CODEX_BIN": codex_bin},
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    return r, model


def steps(env):
    return json.loads(env.envgit("log", "--json", check=True).stdout)


def shell(cmd):
    return Call("exec_command", {"cmd": cmd})


def patch(*lines):
    return Call("apply_patch", "\n".join(["*** Begin Patch", *lines, "*** End Patch"]))


def test_steps_are_the_tool_calls_in_order(proj, codex_bin):
    r, model = run_codex(proj, codex_bin, [
        shell("echo from-the-model; echo to-stderr >&2"),
        patch("*** Add File: notes.txt", "+first line"),
        shell("wc -l notes.txt"),
    ])
    assert r.returncode == 0, r.stderr
    (c1, _, out1), (c2, _, out2), (c3, _, out3) = model.results()
    assert "from-the-model" in out1 and "to-stderr" in out1          # both streams came back
    assert "A notes.txt" in out2 and "1 notes.txt" in out3
    assert (proj.root / "notes.txt").read_text() == "first line\n"
    got = [(s["argv"], s["tool_call_id"]) for s in steps(proj)]
    path = str(proj.root / "notes.txt")
    assert got == [
        (["/bin/bash", "-lc", "echo from-the-model; echo to-stderr >&2"], c1),
        (["cat", "--", path], c2),                                    # apply_patch reads first
        (["sh", "-c", 'cat > "$1"', "envgit-write", path], c2),        # then writes, as a step
        (["/bin/bash", "-lc", "wc -l notes.txt"], c3),
    ]
    sessions = {s["session"] for s in steps(proj)}
    assert len(sessions) == 1 and sessions.pop().startswith("codex-")


def test_file_edit_is_a_step_with_a_snapshot_and_rewinds(proj, codex_bin):
    (proj.root / "app.py").write_text("print('one')\n")
    r, model = run_codex(proj, codex_bin, [
        patch("*** Update File: app.py", "@@", "-print('one')", "+print('two')"),
    ])
    assert r.returncode == 0, r.stderr
    assert (proj.root / "app.py").read_text() == "print('two')\n"
    write = [s for s in steps(proj) if s["argv"][:2] == ["sh", "-c"]]
    assert len(write) == 1 and write[0]["exit_code"] == 0
    snap = write[0]["snapshot"]
    assert snap and {"path": "app.py", "status": "modified"} in snap["paths"]
    before = write[0]["id"] - 1                     # the read of app.py: the tree before the edit
    proj.envgit("rewind", str(before), "--yes", check=True)
    assert (proj.root / "app.py").read_text() == "print('one')\n"


def test_reading_the_ssh_key_through_the_file_tool_is_refused(proj, codex_bin):
    key = str(proj.home / ".ssh" / "id_ed25519")
    r, model = run_codex(proj, codex_bin, [
        patch(f"*** Update File: {key}", "@@", "-ssh-ed25519", "+overwritten"),   # fs/readFile
        Call("view_image", {"path": key}),                                      # fs/getMetadata
    ])
    assert r.returncode == 0, r.stderr
    (_, _, edit), (_, _, view) = model.results()
    assert "No such file" in edit and "No such file" in view and "deny_read ~/.ssh" in view
    sent = json.dumps([e.body for e in model.log])
    assert CANARY not in sent                        # nothing of the key reached the model
    assert (proj.home / ".ssh" / "id_ed25519").read_text() == CANARY + "\n"
    read = [s for s in steps(proj) if s["argv"] == ["cat", "--", key]]
    # the step read the key's placeholder (the daemon saw it open: denied_reads), and the
    # exec-server answered Codex not found, naming the rule
    assert len(read) == 1 and "denied-read" in read[0]["marks"], read
    assert [d["path"] for d in read[0]["denied_reads"]] == [key], read


def test_a_write_outside_the_project_is_refused(proj, codex_bin):
    outside = proj.home / "elsewhere.txt"
    r, model = run_codex(proj, codex_bin, [patch(f"*** Add File: {outside}", "+x")])
    assert r.returncode == 0, r.stderr
    (_, _, out), = model.results()
    assert "Failed to write file" in out, out
    assert not outside.exists()
    write, = [s for s in steps(proj) if s["argv"][:2] == ["sh", "-c"]]
    assert write["argv"][-1] == str(outside) and write["exit_code"] != 0


@pytest.fixture
def pushproj(tmp_path, remote):
    """A clone of the local HTTPS remote, policy `preset: default` with the remote reachable."""
    home = make_home(tmp_path)
    env = Env(home, home / "app", {"ENVGIT_RESOLVE": remote.resolve,
                                   "ENVGIT_UPSTREAM_CA": str(remote.ca.cert_path)})
    clone_for_push(env, remote)
    yield env
    env.stop()


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed (the network gate needs it)")
def test_push_behind_a_variable_is_refused_at_the_request(pushproj, remote, codex_bin):
    before = remote.refs()
    r, model = run_codex(pushproj, codex_bin, [
        shell("echo change >> README && git commit -qam change && git log --oneline | head -1"),
        shell("g=git; $g push origin main"),
    ])
    assert r.returncode == 0, r.stderr
    (_, _, committed), (push_call, _, pushed) = model.results()
    assert "change" in committed
    assert "[remote rejected]" in pushed and "preset:default/git-push" in pushed, pushed
    assert remote.refs() == before                                   # the server never changed
    push = [s for s in steps(pushproj) if s["tool_call_id"] == push_call]
    assert len(push) == 1 and push[0]["exit_code"] != 0
    assert any(q["decision"] == "deny" and q["method"] == "POST" and "git-receive-pack" in q["path"]
               for q in push[0]["requests"]), push[0]["requests"]
    assert not any(m == "POST" and "receive-pack" in p and s == 200 for m, p, s in remote.log)
