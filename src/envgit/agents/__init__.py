"""Adapters that make every tool call of a coding agent an envgit step.

    envgit.agents.main("codex", argv)     envgit is Codex's exec-server (enforced)
    envgit.agents.main("claude", argv)    Claude Code runs inside the sandbox, each Bash call a step
    envgit.agents.main("copilot", argv)   hooks route each bash call through envgit (recorded only)
    envgit.agents.main(AGENT, ["--fork", "3", …])   the agent in 3 new branches at once (forkrun.py)
    envgit.agents.main("claude", ["--learn", …])    its whole session in learn mode (learnmode.py)

Each module exposes `launch(argv) -> int`; nothing here reimplements a step: every command an
agent runs goes through the real `envgit run` client and the project's session daemon."""

import importlib

AGENTS = ("claude", "codex", "copilot")


def main(agent: str, argv: list[str], learn: bool = False) -> int:
    if agent not in AGENTS:
        import sys
        print(f"envgit: no adapter for {agent!r}; known: {', '.join(AGENTS)}", file=sys.stderr)
        return 2
    from .forkrun import ForkError, split_fork
    from .session import AgentError
    try:
        if learn and agent not in ("claude", "codex"):
            raise AgentError(f"--learn works with claude and codex: {agent}'s commands run on the "
                             "host, recorded, not through envgit's gate")
        n, argv = split_fork(list(argv))
        if n is not None:
            if learn:
                raise AgentError("--learn and --fork do not go together yet: start one session "
                                 "with --learn")
            from .forkrun import launch
            return launch(agent, n, argv)
        if agent == "claude":
            from .forkrun import new_branch, split_worktree
            worktree, name, argv = split_worktree(argv)
            if worktree:
                import os
                where = new_branch(agent, name)
                os.chdir(where)
                os.environ["PWD"] = where
    except (ForkError, AgentError) as e:
        import sys
        print(f"envgit: {e}", file=sys.stderr)
        return 2
    module = importlib.import_module(f".{agent}", __name__)
    return module.launch(list(argv), learn=True) if learn else module.launch(list(argv))
