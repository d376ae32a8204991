"""Learn mode, pure: what the gate does with a decision when the step is in learn mode. The
judging is network.py's, called as it is; this module only wraps it.

A step in learn mode (`envgit learn -- CMD`, `envgit learn on`, `envgit claude --learn`) runs
with the policy's gaps open and recorded, so a person can see what a task needs before
writing it down (`envgit policy suggest` reads the records): a request the policy refuses only
because its host is not in `network.allow`, or because `network.l7` does not list its method
or path, is let through, and its record keeps `decision: "allow"` with `learn` = the decision,
rule, kind and reason the gate would have recorded (`lesson`).

Nothing else is relaxed. An irreversible rule (every rule of `irreversible`, the preset's,
`network.deny` entries, which are compiled to the same rules) decides exactly as it does on an
allowed host: a request to a host not in network.allow is judged again as if the host were
allowed and its l7 entry listed every method and path (`widened`), so a `git push` to a host
learn mode let in still meets `preset:default/git-push`. A `builtin:` decision (SSH, a special
address, an ambiguous path, an upgrade, a mismatched Host), a credential's misuse
(proxy/credentials.py, which judges after this and is not told of learn mode) and the file side
(secrets stay unreadable, escape routes read-only: sandbox/view.py builds the same view) are
untouched. The organisation can forbid learn mode (`learn: forbid`: `refusal`)."""

import dataclasses

from . import network
from .hostnames import hostport, norm_host
from .netrequest import Decision, Request

# The only rules learn mode relaxes: a host not allowed, a method or path an l7 entry does not
# list. Anything else a decision cites (an irreversible rule, builtin:, credential-*) stands.
RELAXED = ("network.allow", "network.l7[")

RULE = "learn"                  # the rule a request let through by learn mode is recorded under


def relaxable(d: Decision) -> bool:
    """Would learn mode let this decision's request through?"""
    return d.action in ("deny", "ask") and not d.irreversible and d.rule.startswith(RELAXED)


def lesson(d: Decision) -> dict:
    """What a record let through by learn mode keeps of the decision it would have had."""
    return {"decision": d.action, "rule": d.rule, "kind": d.kind, "reason": d.reason}


def widened(policy, host: str, port: int):
    """`policy` with `host:port` in network.allow and every l7 entry's method and path lists
    dropped (its `websocket` kept: an upgrade is judged as before). Everything else, the
    irreversible rules first, is the policy's own."""
    l7 = {k: {kk: v for kk, v in spec.items() if kk not in ("methods", "paths")}
          for k, spec in policy.l7.items()}
    entry = hostport(norm_host(host), port)
    if ":" not in entry.rsplit("]", 1)[-1]:
        entry = f"{entry}:{port}"       # exactly this port, not both standard ones
    return dataclasses.replace(policy, network_allow=[*policy.network_allow, entry], l7=l7)


def judge_connect(policy, host: str, port: int) -> tuple[Decision, dict | None]:
    """A CONNECT in learn mode: (the decision, the lesson when learn mode let it through). A
    tunnel learn mode opens is intercepted, so each request inside is judged and recorded."""
    d = network.judge_connect(policy, host, port)
    if not relaxable(d):
        return d, None
    return Decision("allow", RULE, f"let through in learn mode: {d.reason}", intercept=True), lesson(d)


def decide_request(policy, req: Request) -> tuple[Decision, dict | None]:
    """A request in learn mode: (the decision, the lesson when learn mode let it through)."""
    d = network.decide_request(policy, req)
    if not relaxable(d):
        return d, None
    again = network.decide_request(widened(policy, req.host, req.port), req)
    if again.action != "allow":
        # what stands on an allowed host too: an irreversible rule's deny or ask, a builtin
        return again, None
    if again.irreversible:          # an irreversible rule that allows and marks: still marked
        return dataclasses.replace(again, reason=f"{again.reason} (let through in learn mode: "
                                   f"{d.reason})"), lesson(d)
    return Decision("allow", RULE, f"let through in learn mode: {d.reason}",
                    watch=again.watch), lesson(d)


def refusal(policy) -> str | None:
    """Why learn mode cannot be switched on under `policy` (None: it can)."""
    if getattr(policy, "learn", "allow") != "forbid":
        return None
    where = policy.where.get("learn", "") if getattr(policy, "where", None) else ""
    by = "the organisation's policy" if policy.org_path and where.startswith(policy.org_path) \
        else "the policy"
    return (f"envgit: learn mode is forbidden by {by} ({where or 'learn'}: learn: forbid): "
            "steps run under the policy as written; run the command without learn mode "
            "(`envgit run`, `envgit learn off`), or ask whoever keeps that file")
