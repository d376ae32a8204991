"""`python -I -m envgit.agents.steprun FD [--] CMD…`: `envgit run` for the Codex exec-server,
with the step's environment read (JSON) from the pipe FD rather than taken from this process.

The exec-server starts this launcher on the host with its own environment, fixed: what the
model asks for in `process/start`'s env (PYTHONPATH, LD_PRELOAD…) would otherwise act on this
host-side process before any sandbox exists. The requested environment goes to the daemon as
the step's, which the policy scrubs (env.pass) for the sandbox, as for any `envgit run`.
"""

import json
import os
import sys

from ..daemon.client import DaemonError, connect
from ..paths import NoProject, find_project
from ..run import SIGNAL_NAMES, execute
from ..sandbox.launch import LaunchError, bwrap_path


def _fail(msg, code=2):
    print(msg, file=sys.stderr)
    return code


def read_env(fd: int) -> dict:
    chunks = []
    with os.fdopen(fd, "rb") as f:
        while True:
            b = f.read(65536)
            if not b:
                break
            chunks.append(b)
    env = json.loads(b"".join(chunks) or b"{}")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the step's environment must be an object of strings")
    return env


def main(argv: list[str]) -> int:
    if not argv or not argv[0].isdigit():
        return _fail("usage: python -I -m envgit.agents.steprun FD [--] CMD [ARGS…]")
    try:
        step_env = read_env(int(argv[0]))
    except (OSError, ValueError) as e:
        return _fail(f"envgit: the step's environment: {e}")
    argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return _fail("envgit: no command")
    cwd = os.getcwd()
    try:
        project = find_project(cwd)
        bwrap_path(project.root)
        conn = connect(project)
        reply = conn.request({"op": "begin", "argv": argv, "cwd": os.path.realpath(cwd), "env": step_env,
                              "pid": os.getpid(), "uid": os.getuid(),
                              "session": os.environ.get("ENVGIT_SESSION"),
                              "tool_call_id": os.environ.get("ENVGIT_TOOL_CALL_ID")})
    except (NoProject, LaunchError) as e:
        return _fail(f"envgit: {e}")
    except (DaemonError, OSError) as e:
        return _fail(f"envgit: {e}", 1)
    if "error" in reply:
        return _fail(reply["error"], reply.get("exit", 1))
    if "refused" in reply:
        return _fail(reply["refused"], 126)
    code, sig = execute(conn, reply["step"], reply["bwrap"], reply["env"], reply.get("bind"), project.root)
    if sig and SIGNAL_NAMES.get(sig) in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT"):
        import signal
        signal.signal(sig, signal.SIG_DFL)     # die the way the command died, as envgit run does
        os.kill(os.getpid(), sig)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
