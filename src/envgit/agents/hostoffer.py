"""Before an agent starts: the exact hosts it needs that the policy does not let it reach,
offered once, on the terminal, before the agent's full-screen UI takes it.

Without this, a first launch under a policy that does not list the model's host ends at the
agent's own connectivity check, and envgit's notices naming the host come only after the UI has
exited. The offer names each host and why the agent needs it, never a preset wider than that;
accepted, the hosts are added to network.allow in envgit.yaml (allowedit.py), the
person's own edit, made before any step runs. Declined, it is not asked again in this project
(the warning line still says what is missing at each launch). Not on a terminal (`-p`, CI):
the warning line only.
"""

import json
import os
import sys

from ..atomicfile import write_atomic


def entry(host: str, port: int) -> str:
    """The network.allow entry for host:port (a bare host stands for 443)."""
    return host if port == 443 else f"{host}:{port}"


def missing(project, needs) -> list[tuple[str, int, str]]:
    """The (host, port, why) of `needs` the project's policy does not allow; [] when the policy
    does not load (the daemon says what is wrong with it)."""
    from ..policy import PolicyError, load_policy
    from ..policy.network import allowed_by
    try:
        pol = load_policy(project.policy)
    except (OSError, PolicyError):
        return []
    return [(h, p, why) for h, p, why in needs if allowed_by(pol, h, p) is None]


def _declined_file(project) -> str:
    return project.state_path("agents", "declined-hosts.json")


def _declined(project) -> set[str]:
    try:
        with open(_declined_file(project)) as f:
            return set(json.load(f))
    except (OSError, ValueError, TypeError):
        return set()


def offer(project, agent: str, needs, stdin=None, out=None) -> None:
    """Say (and on a terminal, offer to add) the hosts of `needs` the policy does not allow."""
    stdin, out = stdin or sys.stdin, out or sys.stderr
    lacking = missing(project, needs)
    if not lacking:
        return
    entries = [entry(h, p) for h, p, _ in lacking]
    listing = "".join(f"envgit:   {entry(h, p):<32} {why}\n" for h, p, why in lacking)
    head = (f"envgit: {agent} needs {'this host' if len(lacking) == 1 else 'these hosts'}, which "
            f"network.allow in {os.path.basename(project.policy)} does not name; without "
            f"{'it' if len(lacking) == 1 else 'them'} it cannot reach its model:\n")
    interactive = stdin.isatty() and out.isatty()
    if not interactive or set(entries) <= _declined(project):
        out.write(head + listing + f"envgit: add {', '.join(json.dumps(e) for e in entries)} to "
                  f"network.allow in {project.policy}\n")
        out.flush()
        return
    out.write(head + listing + "envgit: add them to network.allow now? [y/N] ")
    out.flush()
    answer = stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        try:
            os.makedirs(os.path.dirname(_declined_file(project)), exist_ok=True)
            write_atomic(_declined_file(project), json.dumps(sorted(_declined(project) | set(entries))))
        except OSError:
            pass
        out.write("envgit: not added; not asked again in this project (the line above says what to add)\n")
        return
    from .allowedit import AllowEditError, add_allow
    try:
        add_allow(project.policy, entries)
    except (AllowEditError, OSError) as e:
        out.write(f"envgit: not added: {e}\n")
        return
    out.write(f"envgit: added {', '.join(entries)} to network.allow in {project.policy}\n")
