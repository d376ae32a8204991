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


def _at_least_one(argparse):
    """An argparse type: a whole number, 1 or more (`--keep-last -2` is refused, not obeyed)."""
    def count(text):
        try:
            n = int(text)
        except ValueError:
            n = 0
        if n < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number, 1 or more")
        return n
    return count


def _porcelain(argv):
    import argparse
    from . import commands

    p = argparse.ArgumentParser(prog="envgit", description="version control for the environment "
                                "an AI coding agent works in")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    s = sub.add_parser("init", help="write envgit.yaml and .envgit/ in this directory")
    s.add_argument("--force", action="store_true", help="overwrite an existing envgit.yaml")
    sub.add_parser("run", help="run a command as one sandboxed, recorded step")
    for agent in ("claude", "codex", "copilot"):
        sub.add_parser(agent, help=f"run {agent} with every one of its tool calls a step "
                       "(its own arguments follow)")
    sub.add_parser("mcp", help="the code-mode MCP server: one `execute` tool, every execution a step")

    s = sub.add_parser("log", help="the step timeline")
    s.add_argument("--json", action="store_true")
    s.add_argument("--session")
    s.add_argument("-n", type=int, help="only the last N steps")

    s = sub.add_parser("show", help="one step whole")
    s.add_argument("step", type=int)
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("diff", help="what changed between two steps, or a step and the working tree",
                       usage="envgit diff [A] [B] [--stat] [--json] [-- PATH…]")
    s.add_argument("a", nargs="?", type=int, help="a step (default: the last one)")
    s.add_argument("b", nargs="?", type=int, help="a later step (default: the working tree)")
    s.add_argument("--stat", action="store_true", help="names and sizes only")
    s.set_defaults(paths=[])
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("rewind", help="bring the directory back to the snapshot after step N",
                       usage="envgit rewind N [--yes] [--dry-run] [--json] [-- PATH…]")
    s.add_argument("step", type=int)
    s.add_argument("--yes", "-y", action="store_true", help="do not ask")
    s.add_argument("--dry-run", action="store_true", help="show what would change, change nothing")
    s.set_defaults(paths=[])
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("gc", help="drop snapshots outside a retention rule, and unreachable objects")
    s.add_argument("--keep-last", type=_at_least_one(argparse), metavar="N",
                   help="keep the snapshots of the last N steps (N >= 1)")
    s.add_argument("--keep-within", help="keep snapshots younger than this (e.g. 7d, 12h, 30m)")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("pending", help="questions waiting for a person (asks of running steps)")
    s.add_argument("--json", action="store_true")
    s = sub.add_parser("approve", help="allow a pending request")
    s.add_argument("id", type=int)
    s.add_argument("--rule", action="store_true",
                   help="allow what the same rule matches on that host for the rest of the step")
    s = sub.add_parser("deny", help="deny a pending request")
    s.add_argument("id", type=int)

    s = sub.add_parser("demo", help="a scripted agent against a local git remote: push denied, "
                       "history destroyed, rewind recovers it (about 10 s, no API key)")
    s.add_argument("--keep", metavar="DIR", help="build the demo in DIR and leave it there to explore")
    s.add_argument("--policy", metavar="FILE", help="run the demo under this envgit.yaml instead ({remote} in it stands for "
                   "the demo remote's host:port)")
    s.add_argument("--json", action="store_true", help="one JSON record per step, then the result")

    s = sub.add_parser("doctor", help="what this machine is missing, with the fix for each")
    s.add_argument("--json", action="store_true")

    s = sub.add_parser("fsck", help="verify the journal chain (and the snapshot store)")
    s.add_argument("--json", action="store_true")
    s.add_argument("--repair", action="store_true", help="rebuild a damaged journal.sqlite keeping "
                   "every entry that can still be read (the damaged file is kept beside it)")

    s = sub.add_parser("policy", help="check, show or describe the policy")
    psub = s.add_subparsers(dest="policy_cmd", metavar="ACTION", required=True)
    psub.add_parser("check", help="validate envgit.yaml")
    x = psub.add_parser("show", help="the effective policy, defaults merged, with sources")
    x.add_argument("--json", action="store_true")
    psub.add_parser("schema", help="the JSON Schema of envgit.yaml")
    psub.add_parser("protected", help="the escape routes: files a program outside the sandbox "
                    "obeys, read-only to a step or marked when changed")

    s = sub.add_parser("daemon", help="the session daemon (plumbing)")
    dsub = s.add_subparsers(dest="daemon_cmd", metavar="ACTION", required=True)
    dsub.add_parser("status")
    dsub.add_parser("stop")

    # `-- PATH…` (diff, rewind) is split off here: argparse mixes it up with subcommands.
    paths = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if hasattr(args, "paths"):
        args.paths = paths
    if not args.cmd:
        p.print_help()
        return 2
    return commands.dispatch(args)
