"""What the daemon does for a step on a host that refuses user namespaces, where steps run with
Landlock (sandbox/backend.py): the step's record says so, and it is refused where the policy
forbids the weaker sandbox or where a running step may have written the policy it would run
under."""

from ..paths import external_state
from ..sandbox import backend

INSIDE = ("this project's state (.envgit: its journal and snapshots) is inside it, made where "
          "steps ran in bubblewrap: a step here can write it; `envgit daemon stop`, then `envgit "
          "init`, moves it out to {ext}")


def begin(sess, pol, head, learning) -> dict | None:
    """Adds `sandbox` to a step's begin `head` on such a host; an error reply when the step
    must not run, else None."""
    try:
        if pol.backend != "vm" and (sandbox := backend.record(bool(pol.network_allow) or bool(learning))):
            if not sess.project.state_is_outside:
                sandbox["weaker"].append(INSIDE.format(ext=external_state(sess.project.root)))
            head["sandbox"] = sandbox          # Landlock, and what is weaker
    except RuntimeError as e:                  # neither bwrap nor Landlock can run here
        return {"error": f"envgit: {e}", "exit": 125}
    if head.get("sandbox") and (refused := org_refuses_degraded(pol) or policy_written_by_a_step(sess, pol)):
        return {"error": f"envgit: {refused}", "exit": 125}
    return None


def policy_written_by_a_step(sess, pol) -> str | None:
    """Under Landlock a running step can write envgit.yaml (taken back at its end): a step
    begun meanwhile under a policy other than the running steps' would run under what one of
    them wrote. Refused, and said, until they end."""
    others = sorted(s for s, i in sess.live.items() if getattr(i.policy, "sha256", pol.sha256) != pol.sha256)
    if not others:
        return None
    return (f"envgit.yaml changed while step {others[0]} runs; on this host (Landlock) a running step "
            "can write it, so a step begun now would run under what that step wrote. The change "
            "applies once the running steps end (`envgit ps` lists them; what a step wrote to it is "
            "taken back at its end)")


def org_refuses_degraded(pol) -> str | None:
    """Why a step cannot run on this host with Landlock (`degraded_sandbox: forbid`), or None."""
    if getattr(pol, "degraded_sandbox", "allow") != "forbid":
        return None
    where = pol.where.get("degraded_sandbox", "") if getattr(pol, "where", None) else ""
    return (f"this host refuses the user namespaces bubblewrap needs, and {where or 'the policy'} "
            "forbids running steps with the weaker Landlock sandbox instead (degraded_sandbox: "
            "forbid); run `envgit doctor` for how to allow user namespaces here")
