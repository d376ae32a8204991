"""`envgit codex [codex args…]`: Codex with envgit as its only execution environment.

Codex is started with CODEX_HOME pointing at an overlay under .envgit/agents/<session>/ that
holds two files of envgit's and is otherwise the person's own Codex home:
  environments.toml   the one environment is envgit's exec-server (execserver.py) over stdio;
                      `include_local = false`, so the model cannot choose to run on the host
  hooks.json          a PreToolUse hook that tells the exec-server which tool call is running,
                      so the file steps of an apply_patch carry its tool-call id (trusted for
                      this run only, by a `-c` override: see codex_trust.py)
Every other entry is a link to the person's Codex home (created if absent, as Codex does on its
first run), config.toml included: Codex writes through it (its trust of this folder, the
notices it showed), so its state is theirs and a second session asks nothing the first one
answered, as without envgit (sessions/ is made there first, so its rollouts' recorded paths
keep leading to them and `codex resume` finds them). What Codex creates that was not there to
link (its databases on a first run) is moved into their Codex home when it exits (`adopt`).
`--dangerously-bypass-approvals-and-sandbox` makes Codex send `sandbox: null`: envgit's
sandbox is the one enforced, and Codex asks no approvals of its own (envgit's `ask` does).
`--no-daemon`: the TUI runs its own app server, which ends with it; Codex's shared background
server would outlive the session (its running work, and its exec-server, carrying this
session's id into the next one) and install a 400 MB copy of itself in the overlay.
The person's stdio MCP servers Codex would refuse here: envgit's own is started for the
session over HTTP, the others are said (codex_mcp.py).
The model's commands never see any of this: a step's home view has no ~/.codex, .envgit/ is
closed, and the project's .codex is a protected escape route.
"""

import json
import os
import sys
import time

from ..run import FAILED
from . import learnmode
from .codex_trust import TrustError, hook_identity, trust_override
from .session import (
    AgentError,
    agent_binary,
    announce,
    new_session,
    newest_conversation,
    project_here,
    run_on_terminal,
    say_escape_routes,
    say_resume,
    session_dir,
)

# Ours replace theirs in the overlay only; every other name is the user's own Codex home.
OURS = ("environments.toml", "hooks.json")
CODEX_FLAGS = ["--dangerously-bypass-approvals-and-sandbox", "--no-daemon"]


def user_codex_home() -> str:
    return os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")


def _toml_str(s: str) -> str:
    return json.dumps(s)        # a JSON string is a valid TOML basic string


def build_overlay(project, session: str, user_home: str) -> str:
    home = os.path.join(session_dir(project, session), "codex-home")
    os.makedirs(home, mode=0o700, exist_ok=True)
    os.makedirs(user_home, mode=0o700, exist_ok=True)
    # sessions/ made in their home before a first run, so it is a link too: Codex records each
    # rollout's path as it wrote it (this overlay's sessions/…), and `codex resume` later
    # finds it there only if the path still leads to it
    os.makedirs(os.path.join(user_home, "sessions"), mode=0o700, exist_ok=True)
    # config.toml even when absent: Codex creates it through the link, in their home
    for name in {*os.listdir(user_home), "config.toml"} - set(OURS):
        link = os.path.join(home, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(user_home, name), link)
    calls = os.path.join(session_dir(project, session), "codex-current-call")
    # -P: codex starts these in the project, which `-m` would put first on sys.path
    args = ["-P", "-m", "envgit.agents.execserver", "--project", project.root, "--session", session,
            "--calls", calls]
    with open(os.path.join(home, "environments.toml"), "w") as f:
        f.write("# written by envgit codex: every command and file operation is an envgit step\n"
                'default = "envgit"\ninclude_local = false\n\n[[environments]]\nid = "envgit"\n'
                f"program = {_toml_str(sys.executable)}\n"
                f"args = [{', '.join(_toml_str(a) for a in args)}]\n")
    hook = f"{_sh(sys.executable)} -P -m envgit.agents.codex_hook {_sh(calls)}"
    with open(os.path.join(home, "hooks.json"), "w") as f:
        json.dump({"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [
            {"type": "command", "command": hook, "timeout": 30}]}]}}, f, indent=2)
    return home


def _sh(s: str) -> str:
    import shlex
    return shlex.quote(s)


def adopt(home: str, user_home: str) -> list[str]:
    """Move what Codex created in the overlay (not a link, not ours) into the user's Codex home,
    where it would have written it without envgit; a file Codex replaced by renaming over its
    link replaces theirs. A directory both have (another Codex made it meanwhile) stays here:
    returned, to be said."""
    import shutil
    left = []
    for name in sorted(set(os.listdir(home)) - set(OURS)):
        src, dst = os.path.join(home, name), os.path.join(user_home, name)
        if os.path.islink(src):
            continue
        try:
            if os.path.isdir(src) and os.path.lexists(dst):
                left.append(src)
            elif os.path.lexists(dst):
                os.replace(src, dst)
            else:
                shutil.move(src, dst)
        except OSError:
            left.append(src)
    return left


def command(codex: str, argv: list[str], trust=()) -> list[str]:
    return [codex, *CODEX_FLAGS, *trust, *argv]


def launch(argv: list[str], learn: bool = False) -> int:
    try:
        project = project_here()
        codex = agent_binary("codex", "ENVGIT_CODEX_BIN", "@openai/codex")
    except AgentError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return FAILED               # envgit's own failure, as `envgit run` says it
    session = new_session("codex")
    if learn:                           # before its first step: the whole session (learnmode.py)
        refused = learnmode.switch(project, session, on=True)
        if refused:
            print(refused, file=sys.stderr)
            return 2
        learnmode.announce("Codex")
    user_home = user_codex_home()
    home = build_overlay(project, session, user_home)
    env = {**os.environ, "CODEX_HOME": home, "ENVGIT_SESSION": session}
    env.pop("CODEX_EXEC_SERVER_URL", None)      # environments.toml is the one executor
    trust = []
    try:
        trust = trust_override(*hook_identity(codex, env, os.getcwd(), os.path.join(home, "hooks.json")))
    except (TrustError, OSError) as e:
        print(f"envgit: Codex will not run envgit's hook ({e}): file steps will carry no "
              "tool-call id; commands still do", file=sys.stderr)
    announce("codex", session, "enforced: envgit is its exec-server")
    from .codex_mcp import prepare
    mcp, server = prepare(codex, env, argv, project, session,
                          os.path.join(session_dir(project, session), "mcp-server.log"))
    if server is not None:
        env["ENVGIT_MCP_TOKEN"] = server.token
    started = time.time()
    try:
        return run_on_terminal(command(codex, argv, [*trust, *mcp]), env)
    finally:
        if server is not None:
            server.stop()
        if learn:
            learnmode.switch(project, session, on=False)
        say_escape_routes(project, session)
        for path in adopt(home, user_home):
            print(f"envgit: Codex's {os.path.basename(path)} of this session is kept in {path} "
                  f"({user_home} has its own)", file=sys.stderr)
        # its rollouts: sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl, in their home once adopted
        conversation = newest_conversation([(d, "sessions/*/*/*/rollout-*.jsonl") for d in (user_home, home)],
                                           started)
        say_resume(f"envgit codex resume {conversation}" if conversation else None)
