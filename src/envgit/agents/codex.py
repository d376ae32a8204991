"""`envgit codex [codex args…]`: Codex with envgit as its only execution environment.

Codex is started with CODEX_HOME pointing at an overlay under .envgit/agents/<session>/: every
entry of the user's own Codex home (auth.json, sessions/, …) is linked into it, so their login
and history apply unchanged; config.toml is copied, with the trust of envgit's hook appended
(see codex_trust.py); and two files are envgit's:
  environments.toml   the one environment is envgit's exec-server (execserver.py) over stdio;
                      `include_local = false`, so the model cannot choose to run on the host
  hooks.json          a PreToolUse hook that tells the exec-server which tool call is running,
                      so the file steps of an apply_patch carry its tool-call id
`--dangerously-bypass-approvals-and-sandbox` makes Codex send `sandbox: null`: envgit's
sandbox is the one enforced, and Codex asks no approvals of its own (envgit's `ask` does).
The user's files are never edited.
"""

import json
import os
import subprocess
import sys

from .codex_trust import TrustError, hook_identity, trust_block
from .session import AgentError, agent_binary, announce, new_session, project_here, session_dir

# Codex asks its environment for nothing else; these names are the user's own Codex home,
# linked into the overlay. Ours replace theirs in the overlay only.
OURS = ("environments.toml", "hooks.json", "config.toml")
CODEX_FLAGS = ["--dangerously-bypass-approvals-and-sandbox"]


def user_codex_home() -> str:
    return os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")


def _toml_str(s: str) -> str:
    return json.dumps(s)        # a JSON string is a valid TOML basic string


def build_overlay(project, session: str, user_home: str) -> str:
    home = os.path.join(session_dir(project, session), "codex-home")
    os.makedirs(home, mode=0o700, exist_ok=True)
    if os.path.isdir(user_home):
        for name in os.listdir(user_home):
            link = os.path.join(home, name)
            if name not in OURS and not os.path.lexists(link):
                os.symlink(os.path.join(user_home, name), link)
    config = os.path.join(user_home, "config.toml")
    with open(os.path.join(home, "config.toml"), "w") as f:
        if os.path.isfile(config):
            with open(config) as user:
                f.write(user.read())
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


def command(codex: str, argv: list[str]) -> list[str]:
    return [codex, *CODEX_FLAGS, *argv]


def launch(argv: list[str]) -> int:
    try:
        project = project_here()
        codex = agent_binary("codex", "ENVGIT_CODEX_BIN", "@openai/codex")
    except AgentError as e:
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    session = new_session("codex")
    home = build_overlay(project, session, user_codex_home())
    env = {**os.environ, "CODEX_HOME": home, "ENVGIT_SESSION": session}
    env.pop("CODEX_EXEC_SERVER_URL", None)      # environments.toml is the one executor
    try:
        key, digest = hook_identity(codex, env, os.getcwd(), os.path.join(home, "hooks.json"))
        with open(os.path.join(home, "config.toml"), "a") as f:
            f.write(trust_block(key, digest))
    except (TrustError, OSError) as e:
        print(f"envgit: Codex will not run envgit's hook ({e}): file steps will carry no "
              "tool-call id; commands still do", file=sys.stderr)
    announce("codex", session, "enforced: envgit is its exec-server")
    try:
        return subprocess.call(command(codex, argv), env=env)
    except KeyboardInterrupt:
        return 130
