"""The policy's answer for an agent's in-process file tool (Claude's Read, Copilot's view):
the same decision the sandbox's mounts follow, asked before the tool runs."""

import os

from ..policy import PolicyError, decide_path, load_policy


def closed_path(project, path: str, cwd: str, write: bool) -> str | None:
    """Why the sandbox would refuse reading (or, with `write`, writing) `path`, or None."""
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    try:
        pol = load_policy(project.policy)
    except (OSError, PolicyError) as e:
        return f"the envgit policy cannot be read: {e}"
    d = decide_path(pol, full, project.root, os.path.realpath(os.path.expanduser("~")))
    if d.access == "none":
        return f"{full} is closed to the agent by the envgit policy ({d.rule})"
    if write and d.access != "write":
        return f"{full} is not writable under the envgit policy ({d.rule})"
    return None
