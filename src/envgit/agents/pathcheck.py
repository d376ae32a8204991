"""The policy's answer for an agent's in-process file tool (Copilot's view/glob/grep/create/
edit, which run on the host, unsandboxed): the same decision the sandbox's mounts follow, asked
before the tool runs. Only Copilot's hook asks it (Claude's tools run inside its own sandbox,
Codex's file operations are steps of the exec-server).

The path is judged as the host will open it, not by its name alone: a step can leave
`proj/link -> ~/.ssh/id_ed25519` (or a link to a denied directory) in the project, and the
host's open follows every symlink in the path. So both the name and its realpath must pass.
And a step's /tmp is not the host's: each step gets a private directory of its own there
(removed with it), so the host's /tmp holds nothing a step wrote and whatever other users
planted; a file tool is refused there rather than let it read or write what no step sees."""

import os

from ..policy import PolicyError, load_policy, resolve
from ..policy.decide import abs_match, decide_resolved

# Paths a step sees as something other than the host's path of that name (sandbox/view.py):
# a private /tmp. /run, /var/tmp, /proc and /dev are fresh too, but the policy already closes
# them (not part of the step's view).
STEP_OWN = ("/tmp",)


def closed_path(project, path: str, cwd: str, write: bool) -> str | None:
    """Why the sandbox would refuse reading (or, with `write`, writing) `path`, or None."""
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    try:
        pol = load_policy(project.policy)
    except (OSError, PolicyError) as e:
        return f"the envgit policy cannot be read: {e}"
    rules = resolve(pol, project.root, os.path.realpath(os.path.expanduser("~")))
    why = _judge(rules, full, write)
    if why:
        return f"{full} {why}"
    real = _as_named(project.root, os.path.realpath(full))
    if real != full:
        why = _judge(rules, real, write)
        if why:
            return f"{full} leads through a symlink to {real}, which {why}"
    return None


def _as_named(root, real):
    """`real` under the project's own name: the project may itself sit behind a symlink (the
    policy and the sandbox know it by the name it was opened with)."""
    base = os.path.realpath(root)
    if base != root and (real == base or real.startswith(base + "/")):
        return root + real[len(base):]
    return real


def _judge(rules, p, write):
    """Why `p` (as the host opens it) is refused, said after its name, or None."""
    d = decide_resolved(rules, p)
    if d.access == "none":
        return f"is closed to the agent by the envgit policy ({d.rule})"
    if write and d.access != "write":
        return f"is not writable under the envgit policy ({d.rule})"
    own = next((t for t in STEP_OWN if p == t or p.startswith(t + "/")), None)
    if own and not _seen_as_is(rules, p):
        return (f"is in the host's {own}, which is not a step's: each step has a private {own} of "
                f"its own, so this tool (run on the host) would {'write' if write else 'read'} what "
                f"no step sees; use a path in the project, or a bash command (a step)")
    return None


def _seen_as_is(rules, p):
    """Whether a step sees the host's `p` under that name though it is in a remapped directory:
    the project, or a path the policy binds in (allow_read, allow_write), bound over it."""
    if p == rules.project or p.startswith(rules.project + "/"):
        return True
    return any(abs_match(e, p) for e, _ in rules.write_abs + rules.allow_abs)
