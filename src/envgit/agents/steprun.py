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

from ..run import fail, step


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
    """As `envgit run` (run.step: the same exit status, streams and terminal), but the step's
    environment is the one read from FD."""
    if not argv or not argv[0].isdigit():
        return fail("envgit: usage: python -I -m envgit.agents.steprun FD [--] CMD [ARGS…]")
    try:
        step_env = read_env(int(argv[0]))
    except (OSError, ValueError) as e:
        return fail(f"envgit: the step's environment: {e}")
    argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return fail("envgit: no command given: python -I -m envgit.agents.steprun FD [--] CMD [ARGS…]")
    return step(argv, step_env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
