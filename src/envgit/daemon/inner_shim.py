#!/usr/bin/env python3
"""envgit's shim for inside a sandbox: run ARGV as a step of its own through the inner control
socket, with this process's stdin, stdout and stderr, and exit with the step's status.

    python3 inner_shim.py CMD [ARGS…]          (ENVGIT_INNER_SOCKET names the socket)

Standalone on purpose (only the standard library, no envgit import): it runs inside the
sandbox, where the envgit package is not visible; it is bound in read-only. Its framing is
inner.py's: a 4-byte big-endian length and a UTF-8 JSON object; the three fds travel with the
first bytes (SCM_RIGHTS).
"""

import array
import json
import os
import socket
import sys


def _exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("the envgit daemon closed the connection")
        buf += chunk
    return buf


MAX_REPLY = 1 << 20


def frame(msg: dict) -> bytes:
    body = json.dumps(msg, ensure_ascii=True, separators=(",", ":")).encode()
    return len(body).to_bytes(4, "big") + body


def reply(s) -> dict:
    size = int.from_bytes(_exact(s, 4), "big")
    if size > MAX_REPLY:
        raise EOFError(f"the envgit daemon sent a {size}-byte reply")
    try:
        out = json.loads(_exact(s, size))
    except ValueError:
        raise EOFError("the envgit daemon's reply is not JSON") from None
    return out if isinstance(out, dict) else {"error": "envgit: a reply that is not an object"}


def run(argv, env=None, tool_call_id=None, cwd_file=None) -> dict:
    msg = {"op": "run", "argv": argv, "cwd": os.getcwd(), "env": dict(env or os.environ),
           "tool_call_id": tool_call_id or os.environ.get("ENVGIT_TOOL_CALL_ID")}
    if cwd_file:
        msg["cwd_file"] = cwd_file          # inner.py: the shell's last directory goes there
    return _ask(msg)


def _ask(msg: dict) -> dict:
    """Send `msg` with this process's stdin, stdout and stderr; the daemon's reply."""
    data = frame(msg)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ.get("ENVGIT_INNER_SOCKET", "/run/envgit/control.sock"))
    with s:
        s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        s.sendall(data[4:])
        return reply(s)


def exit_code(argv, tool_call_id=None, cwd_file=None) -> int:
    """Run ARGV as a step; its exit status, or envgit's own when it could not run."""
    return _status(lambda: run(argv, tool_call_id=tool_call_id, cwd_file=cwd_file))


def mcp_exit_code(project=None) -> int:
    """envgit's own MCP server, run by the daemon on the host on this process's stdio (the
    daemon's mcphost.py); its exit status."""
    return _status(lambda: _ask({"op": "mcp", **({"project": project} if project else {})}))


def _status(ask) -> int:
    try:
        reply = ask()
    except (OSError, EOFError) as e:
        print(f"envgit: cannot reach the envgit daemon from inside the sandbox: {e}", file=sys.stderr)
        return 125
    if "error" in reply:
        print(reply["error"], file=sys.stderr)
        return reply.get("exit", 1)
    return reply["exit_code"]


def main():
    if len(sys.argv) < 2:
        print("usage: inner_shim.py CMD [ARGS…]", file=sys.stderr)
        return 2
    return exit_code(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
