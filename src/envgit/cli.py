"""The command line: argument parsing and rendering only.

`envgit run` is dispatched before argparse is even imported: it is the hot path.
Exit codes: the step's own for `run`; for the rest 0 ok, 1 failure, 2 usage or bad input,
3 the session daemon could not be reached or went away, 4 the snapshot store is damaged
(a missing or corrupt object, pack or index), 5 the journal cannot be read. Operational
failures are one `envgit: …` line saying what to do (commands.operational), never a traceback.
"""

import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        from .run import run
        sys.exit(run(argv[1:]))
    if argv[:1] in (["claude"], ["codex"], ["copilot"]):
        from .agents import main as agent          # every argument is the agent's own
        sys.exit(agent(argv[0], argv[1:]))
    if argv[:1] == ["mcp"]:
        from .mcp import main as mcp
        sys.exit(mcp(argv[1:]))
    sys.exit(_porcelain(argv))


def _porcelain(argv):
    import argparse
    from . import commands

    p = argparse.ArgumentParser(prog="envgit", description="version control for the environment "
                                "an AI coding agent works in")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    sub.add_parser("run", help="run a command as one sandboxed, recorded step")
    for agent in ("claude", "codex", "copilot"):
        sub.add_parser(agent, help=f"run {agent} with every one of its tool calls a step "
                       "(its own arguments follow)")
    sub.add_parser("mcp", help="the code-mode MCP server: one `execute` tool, every execution a step")
    import importlib
    for name in commands.MODULES:
        importlib.import_module(f".commands.{name}", __package__).add_parsers(sub, argparse)

    # `-- PATH…` (diff, rewind) is split off here: argparse mixes it up with subcommands.
    paths = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if hasattr(args, "paths"):
        args.paths = paths
    if not args.cmd:
        p.print_help()
        return 2
    return commands.dispatch(args)
