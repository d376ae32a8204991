"""The command line: argument parsing and rendering only.

`envgit run` is dispatched before argparse is even imported: it is the hot path. So are the
agents and `mcp`, whose arguments are their own; `envgit run --help` (and `envgit claude -h`…)
is envgit's help for them, `envgit run -- --help` runs the command's own.
Exit codes of `run` (and of the agents' steps), by the shell's convention as `env`, `timeout`
and `docker run` use it: the command's own code unchanged (a command's own `exit 130` too);
a command that died of signal N ends envgit by N (the shell shows 128+N); 127 the command was
not found, 126 it could not be run (not executable, or refused by a `shell:` rule); 125
envgit's own failure (no project, a bad policy, bubblewrap or perl missing, the sandbox or its
network bridge did not start, the session daemon unreachable), with one `envgit:` line naming
the fix (run.py). For the rest: 0 ok, 1 failure, 2 usage or bad input, 3 the session daemon
could not be reached or went away, 4 the snapshot store is damaged (a missing or corrupt
object, pack or index), 5 the journal cannot be read, 125 an optional part (an extra) is not
installed (extras.py). Operational failures are one `envgit: …` line saying what to do
(commands.operational), never a traceback.
"""

import sys

HELP = (["-h"], ["--help"])
AGENTS = ("claude", "codex", "copilot")

# Shown under `envgit --help`.
EXIT_STATUS = """exit status:
  run: the command's own (its `exit 130` too); a command killed by signal N: 128+N
    (envgit dies of N as the command did); 127 command not found; 126 found but not
    executable, or refused by a shell: rule; 125 envgit itself failed (no project, bad
    policy, bubblewrap or perl missing, the sandbox or network bridge did not start, the
    session daemon unreachable), said in one `envgit:` line with the fix
  claude, codex, copilot: the agent's own
  others: 0 ok, 1 failure, 2 usage or bad input, 3 the session daemon could not be reached,
  4 the snapshot store is damaged, 5 the journal cannot be read, 125 the optional part
  it needs is not installed (the `pip install 'envgit[…]'` line says which)"""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"] and argv[1:2] not in HELP:
        from .run import run
        _exit_now(run(argv[1:]))
    if argv[:1] == ["learn"] and argv[1:2] == ["--"]:
        from .run import learning  # one step in learn mode: the hot path too
        _exit_now(learning(argv[2:]))
    if argv[:1] in ([a] for a in AGENTS) and argv[1:2] not in HELP:
        from .agents import main as agent  # every argument is the agent's own
        rest = argv[1:]
        learn = rest[:1] == ["--learn"]     # envgit's, before the agent's own: learnmode.py
        rest = rest[1:] if learn else rest
        sys.exit(agent(argv[0], rest[1:] if rest[:1] == ["--"] else rest, learn=learn))
    if argv[:1] == ["mcp"] and argv[1:2] not in HELP:
        from . import extras
        from .mcp import main as mcp
        try:
            sys.exit(mcp(argv[1:]))
        except extras.MissingExtra as e:
            sys.exit(extras.say(e))
    sys.exit(_porcelain(argv))


def _exit_now(code: int):
    """End a step's client without the interpreter's teardown (finalising every module and
    object: ~2.5 ms of a ~40 ms step, bench/timeline_step.py). The client holds nothing that
    needs it: no atexit handler, no temporary file, its sandbox and daemon connection closed
    already; only stdout and stderr may hold buffered text."""
    import os
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass                        # a reader gone or a stream closed: nothing more to say
    os._exit(code)


def _porcelain(argv):
    from . import extras
    try:
        code = _parse_and_dispatch(argv)
        sys.stdout.flush()              # a closed pipe shows here, not at interpreter exit
        return code
    except extras.MissingExtra as e:    # an optional part not installed: its pip line, exit 125
        return extras.say(e, json="--json" in argv)
    except BrokenPipeError:
        _die_of(13)                     # SIGPIPE, as git does: no traceback, status 128+13
    except KeyboardInterrupt:
        _die_of(2)                      # SIGINT: the shell sees an interrupted command


def _die_of(signum):
    """End the way a process killed by `signum` ends (what a shell and `set -o pipefail`
    expect), with nothing more written to a stdout whose reader may be gone."""
    import os
    import signal
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)              # not reached unless the signal is blocked


def _parser(json_errors, command=None):
    """The command line's parser: only `command`'s own module's parsers when it is a command
    whose module is known (commands.COMMAND_MODULE), else the whole tree (`envgit --help`, an
    unknown command, completion)."""
    import argparse

    from . import __version__, commands

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            """A usage error: argparse's lines, or with --json the error document."""
            if json_errors:
                commands.out({"error": f"{self.prog}: {message}", "exit": commands.EXIT_USAGE})
                sys.exit(commands.EXIT_USAGE)
            super().error(message)

    p = Parser(prog="envgit", description="version control for the environment an AI coding "
               "agent works in", epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"envgit {__version__}")
    p.set_defaults(parser_root=p)       # `envgit completion` reads the whole tree from it
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    import importlib
    module = commands.COMMAND_MODULE.get(command or "")
    if module is not None:
        importlib.import_module(f".commands.{module}", __package__).add_parsers(sub, argparse)
        return p
    _hot_path_parsers(sub, commands)
    for name in commands.MODULES:
        importlib.import_module(f".commands.{name}", __package__).add_parsers(sub, argparse)
    return p


def _hot_path_parsers(sub, commands):
    """run, the agents and mcp are dispatched before argparse (main); these parsers are their
    `--help` and their line in `envgit --help`."""
    import argparse
    s = commands.command(sub, "run", help="run a command as one sandboxed, recorded step",
                         usage="envgit run [-p [HOST_PORT:]PORT]… [--] CMD [ARG…]",
                         example=["envgit run -- npm install",
                                  "envgit run -p 5173 -- npm run dev   # open http://127.0.0.1:5173/",
                                  "envgit run -- python3 --help     # the command's own --help"])
    s.add_argument("-p", "--publish", action="append", metavar="[HOST_PORT:]PORT",
                   help="let the person reach a server the step starts on PORT, at the host's "
                        "127.0.0.1:HOST_PORT (default the same port), while the step runs")
    s.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARG…]",
                   help="the command and its arguments; `--` first when the command's own "
                        "start with `-`")
    for agent in AGENTS:
        s = commands.command(sub, agent, help=f"run {agent} with every one of its tool calls a step "
                             "(its own arguments follow)",
                             usage=f"envgit {agent} {'[--learn] ' if agent != 'copilot' else ''}[--] [ARG…]",
                             example=[f"envgit {agent}", f"envgit {agent} -- --help     # {agent}'s own help",
                                      *([f"envgit {agent} --learn   # the whole session in learn mode "
                                         "(envgit learn --help)"] if agent != "copilot" else [])])
        s.add_argument("args", nargs=argparse.REMAINDER, metavar="ARG…",
                       help=f"{agent}'s own arguments; `--` first for its -h/--help")
    s = commands.command(sub, "mcp", help="the code-mode MCP server: one `execute` tool, every "
                         "execution a step", usage="envgit mcp [--project DIR] [--http [HOST:]PORT]",
                         example=["envgit mcp                       # MCP on stdin/stdout",
                                  "envgit mcp --http 127.0.0.1:8931"])
    s.add_argument("--project", metavar="DIR", help="the envgit project at or above DIR "
                   "(default: the current directory)")
    s.add_argument("--http", metavar="[HOST:]PORT", help="serve streamable HTTP at "
                   "http://HOST:PORT/mcp (HOST defaults to 127.0.0.1) instead of stdio")


def _parse_and_dispatch(argv):
    from . import commands
    # `-- PATH…` (diff, rewind, restore) is split off here: argparse mixes it up with subcommands.
    head, paths = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = _parser(json_errors="--json" in head, command=head[0] if head else None)
    args = p.parse_args(head)
    if hasattr(args, "paths"):
        args.paths = paths
    if not args.cmd:
        p.print_help()
        return commands.EXIT_USAGE
    return commands.dispatch(args)
