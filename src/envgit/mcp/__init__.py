"""envgit mcp: the code-mode MCP server. `main(argv)` is the `envgit mcp` subcommand."""

USAGE = """usage: envgit mcp [--project DIR] [--http [HOST:]PORT]
  Serves MCP on stdin/stdout (the way agents start servers), or streamable HTTP at
  http://HOST:PORT/mcp (HOST defaults to 127.0.0.1; port 0 picks a free one, said on stderr
  once serving). Over HTTP, set ENVGIT_MCP_TOKEN: every request must then carry
  `Authorization: Bearer <it>` (without it any local user can run code under the upstream
  servers' tokens). The project is the envgit project at or above DIR (default: the current
  directory); upstream servers, tool rules and limits are the `mcp:` section of its
  envgit.yaml."""


def _parse(argv):
    """(project dir or None, transport, host, port), or a usage message."""
    start, transport, host, port = None, "stdio", "127.0.0.1", 0
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag not in ("--project", "--http") or not args:
            return f"envgit mcp: unexpected {flag!r}\n{USAGE}"
        value = args.pop(0)
        if flag == "--project":
            start = value
            continue
        h, _, p = value.rpartition(":")
        if not p.isdigit():
            return f"envgit mcp: {value!r} is not [HOST:]PORT\n{USAGE}"
        transport, host, port = "http", h or "127.0.0.1", int(p)
    return start, transport, host, port


def main(argv: list[str]) -> int:
    import sys
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    parsed = _parse(argv)
    if isinstance(parsed, str):
        print(parsed, file=sys.stderr)
        return 2
    start, transport, host, port = parsed
    from ..paths import NoProject, find_project
    from ..policy import PolicyError, load_policy
    try:
        project = find_project(start)
        policy = load_policy(project.policy)
    except (NoProject, PolicyError) as e:
        print(f"envgit mcp: {e}", file=sys.stderr)
        return 2
    from ..extras import need
    need("mcp")                         # cli.main says a missing extra in one line (exit 125)
    import anyio

    from .server import serve
    try:
        return anyio.run(serve, project, policy, transport, host, port)
    except KeyboardInterrupt:
        return 0
