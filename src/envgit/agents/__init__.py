"""Adapters that make every tool call of a coding agent an envgit step.

    envgit.agents.main("codex", argv)     envgit is Codex's exec-server (enforced)
    envgit.agents.main("claude", argv)    Claude Code runs inside the sandbox, each Bash call a step
    envgit.agents.main("copilot", argv)   hooks route each bash call through envgit (recorded only)

Each module exposes `launch(argv) -> int`; nothing here reimplements a step: every command an
agent runs goes through the real `envgit run` client and the project's session daemon."""

import importlib

AGENTS = ("claude", "codex", "copilot")


def main(agent: str, argv: list[str]) -> int:
    if agent not in AGENTS:
        import sys
        print(f"envgit: no adapter for {agent!r}; known: {', '.join(AGENTS)}", file=sys.stderr)
        return 2
    return importlib.import_module(f".{agent}", __name__).launch(list(argv))
