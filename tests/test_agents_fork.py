"""`envgit claude --fork N -p PROMPT`: the real Claude Code (pinned, from npm), in N new branches
at once, each run a session of its own branch against the scripted model server, then the
branches side by side."""

import json
import shutil
import subprocess

import pytest

from conftest import ENVGIT
from envgit.agents.forkrun import ForkError, split_fork, split_worktree
from envgit.branch import registry
from envgit.paths import Project
from modelserver import ModelServer, agent_bin, claude_env

MODEL_HOST = "model.example.test"


def envgit_claude(proj, model, *args):
    """`envgit claude ARGS… -p go` against the scripted model, after a first step (the policy
    lets the model's host through the gate)."""
    proj.write_policy(f'version: 1\nnetwork:\n  allow: ["{MODEL_HOST}:{model.port}"]\n')
    proj.run("true", check=True)
    env = {**proj.env, **claude_env(f"http://{MODEL_HOST}:{model.port}"), "ENVGIT_CLAUDE_BIN": agent_bin("claude"),
           "ENVGIT_RESOLVE": f"{MODEL_HOST}=127.0.0.1"}
    return subprocess.run([ENVGIT, "claude", *args, "-p", "go", "--dangerously-skip-permissions"],
                          cwd=proj.root, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)


def test_the_fork_count_is_read_before_the_agents_own_arguments():
    assert split_fork(["--fork", "3", "-p", "go"]) == (3, ["-p", "go"])
    assert split_fork(["--fork=2", "exec", "x"]) == (2, ["exec", "x"])
    assert split_fork(["-p", "--fork", "3"]) == (None, ["-p", "--fork", "3"])   # the agent's own
    for bad in (["--fork"], ["--fork", "x"], ["--fork", "0"], ["--fork", "17"]):
        with pytest.raises(ForkError):
            split_fork(bad)


def test_an_interactive_fork_is_refused_before_anything_is_made(proj):
    proj.run("true", check=True)
    r = proj.envgit("claude", "--fork", "2")
    assert r.returncode == 2 and "-p or --print" in r.stderr and "Traceback" not in r.stderr
    assert registry.forks(Project(str(proj.root))) == []


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed (Claude reaches its model only "
                    "through the gate)")
def test_claude_runs_in_each_new_branch_and_the_branches_are_compared(proj):
    (proj.root / "a.txt").write_text("base\n")
    with ModelServer([], final="forked-answer") as model:
        r = envgit_claude(proj, model, "--fork", "2")
    forks = registry.forks(Project(str(proj.root)))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert [f["id"] for f in forks] == [1, 2]
        assert "branch 1: claude exited 0" in r.stderr and "branch 2: claude exited 0" in r.stderr
        assert "# compare main 1 2" in r.stdout
        for f in forks:
            steps = json.loads(subprocess.run([ENVGIT, "log", "--json"], cwd=f["dir"], env=proj.env,
                                              capture_output=True, text=True, check=True).stdout)
            session = [s for s in steps if "agent-session" in s["marks"]]
            assert session and session[0]["exit_code"] == 0 and session[0]["argv"][0] == "claude"
        logs = r.stderr.split("their output: ", 1)[1].split("/\n", 1)[0]
        assert all("forked-answer" in open(f"{logs}/{f['id']}.log").read() for f in forks)
    finally:
        for f in forks:
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=f["dir"], env=proj.env, capture_output=True, timeout=30)


def test_claudes_worktree_flag_is_read_wherever_it_is():
    assert split_worktree(["-w", "fix", "-p", "go"]) == (True, "fix", ["-p", "go"])
    assert split_worktree(["-p", "go", "--worktree"]) == (True, None, ["-p", "go"])
    assert split_worktree(["--worktree", "-p", "go"]) == (True, None, ["-p", "go"])
    assert split_worktree(["--worktree=x", "-p", "go"]) == (True, "x", ["-p", "go"])
    assert split_worktree(["-p", "go", "--", "-w"]) == (False, None, ["-p", "go", "--", "-w"])


@pytest.mark.skipif(shutil.which("socat") is None, reason="socat is not installed (Claude reaches its model only "
                    "through the gate)")
def test_claude_with_worktree_works_in_a_new_branch_not_the_project(proj):
    """`envgit claude --worktree NAME`: the session is a new envgit branch's (ignored files too),
    its Bash calls steps there; the project's own tree is untouched."""
    from modelserver import Call
    (proj.root / ".gitignore").write_text("secret-build/\n")
    (proj.root / "secret-build").mkdir()
    (proj.root / "secret-build" / "out.bin").write_text("built\n")
    script = [Call("Bash", {"command": "cat secret-build/out.bin > seen.txt && pwd -P", "description": "s"})]
    with ModelServer(script, final="worktree-answer") as model:
        r = envgit_claude(proj, model, "--worktree", "fix")
        results = model.results()
    forks = registry.forks(Project(str(proj.root)))
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        [f] = forks
        assert f"in branch {f['id']} of this project, {f['dir']}" in r.stderr
        assert results and results[0][2].strip().endswith(f["dir"]), results
        assert open(f"{f['dir']}/seen.txt").read() == "built\n"     # the ignored file was there
        assert not (proj.root / "seen.txt").exists()
        steps = json.loads(subprocess.run([ENVGIT, "log", "--json"], cwd=f["dir"], env=proj.env,
                                          capture_output=True, text=True, check=True).stdout)
        assert any(s["argv"][-1].startswith("cat secret-build") for s in steps), steps
        main = json.loads(proj.envgit("log", "--json", check=True).stdout)
        assert not any("agent-session" in s["marks"] for s in main)
    finally:
        for f in forks:
            subprocess.run([ENVGIT, "daemon", "stop"], cwd=f["dir"], env=proj.env, capture_output=True, timeout=30)
