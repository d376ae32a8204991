"""envgit mcp: the code-mode MCP server. `main(argv)` is the `envgit mcp` subcommand."""

USAGE = """usage: envgit mcp [--http [HOST:]PORT]
  Serves MCP on stdin/stdout (the way agents start servers), or streamable HTTP at
  http://HOST:PORT/mcp (HOST defaults to 127.0.0.1). Run it inside an envgit project:
  upstream servers, tool rules and limits are the `mcp:` section of envgit.yaml."""


def main(argv: list[str]) -> int:
    import sys
    transport, host, port = "stdio", "127.0.0.1", 0
    args = list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args[:1] == ["--http"] and len(args) == 2:
        where = args[1]
        host, _, port_text = where.rpartition(":") if ":" in where else ("127.0.0.1", "", where)
        if not port_text.isdigit():
            print(f"envgit mcp: {where!r} is not [HOST:]PORT\n{USAGE}", file=sys.stderr)
            return 2
        transport, host, port = "http", host or "127.0.0.1", int(port_text)
    elif args:
        print(USAGE, file=sys.stderr)
        return 2
    from ..paths import NoProject, find_project
    from ..policy import PolicyError, load_policy
    try:
        project = find_project()
        policy = load_policy(project.policy)
    except (NoProject, PolicyError) as e:
        print(f"envgit mcp: {e}", file=sys.stderr)
        return 2
    import anyio
    from .server import serve
    try:
        return anyio.run(serve, project, policy, transport, host, port)
    except KeyboardInterrupt:
        return 0
