"""What envgit says about the hosts a step could not reach: once per step, with where
`network.allow` is in the policy file and the exact line that would allow them.

Two sources feed it: the names the step asked its resolver for (sandbox/resolver.py: every
name is answered "does not exist"), said after the step; and the gate's denials of hosts not
in network.allow (with the network on), said when the first request to a host is denied.
Either way a host is said once per step, however often the client retries it.
"""

import json
import os
from functools import lru_cache

from ..inert import some
from ..policy import defaults
from ..policy.hostnames import norm_host, not_suggested
from ..policy.network import allowed_by

_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def wanted_hosts(names) -> list[str]:
    """The looked-up names a person could put in network.allow: a dotted host name of letters,
    digits, '-' and '_' (any other name is the step's invention: it stays in the journal, in
    its escaped form, and is not said), not a reverse lookup (*.arpa). A single label (the
    sandbox's own hostname, a search-list guess) is left out too."""
    out = []
    for n in names:
        h = n.rstrip(".").lower()
        if ("." in h and set(h) <= _HOST_CHARS and not h.endswith(".arpa") and len(h) <= 253
                and h not in out):
            out.append(h)
    return out


def split_offered(hosts) -> tuple[list[str], list[tuple[str, str]]]:
    """(the hosts envgit may offer a line for, [(host, why not)] for the others): a step
    chooses what it looks up or asks the gate for, so a cloud metadata name, an IP literal, a
    loopback or private-suffix name is said as looked up, never with a line that allows it
    (hostnames.not_suggested decides)."""
    offered, withheld = [], []
    for h in hosts:
        why = not_suggested(h.rsplit(":", 1)[0] if h.count(":") == 1 else h)
        if why is None:
            offered.append(h)
        else:
            withheld.append((h, why))
    return offered, withheld


def withheld_notice(withheld) -> str:
    """One line for hosts envgit does not suggest: named (inert: the caller escapes) with why,
    and no line to add (the word that would read as one is not used either)."""
    what = ", ".join(f"{h} ({why})" for h, why in withheld[:8])
    more = f" and {len(withheld) - 8} more" if len(withheld) > 8 else ""
    return (f"looked up {what}{more}: not reachable, and not a host envgit suggests opening "
            "(only a person who means it names it exactly in the policy)")


def entry_for(host: str, exact: bool = False) -> str:
    """What to add to network.allow for `host`: the preset that names it (the client's other
    hosts come with it, e.g. preset:npm), else the host itself. `exact`: the host itself
    always (what an agent contacted for its own housekeeping is not a reason to open a
    preset's other hosts to every step)."""
    presets = [] if exact else defaults.presets_naming(host)
    return presets[0] if presets else host


def direct_lookups(policy, hosts) -> list[str]:
    """Of `hosts` (looked up by the step itself), those network.allow allows: the step's
    program resolved them instead of asking envgit's proxy, which is the only way out."""
    return [h for h in hosts if policy.network_allow and allowed_by(policy, norm_host(h), 443)]


def advice(policy, hosts: list[str], exact: bool = False) -> str:
    """One line: which hosts, that they are not in network.allow (file:line), and the exact
    line that allows them (`exact`: the hosts themselves, never a preset)."""
    entries = []
    for h in hosts:
        e = entry_for(h, exact)
        if e not in entries:
            entries.append(e)
    what = some(hosts, 8)
    them = "it" if len(hosts) == 1 else "them"
    where, fix = _fix(policy.path, policy.sha256, tuple(entries))
    via = [f"{e} is {', '.join(defaults.NETWORK_PRESETS[e[len(defaults.PRESET_PREFIX):]][0])}"
           for e in entries if e.startswith(defaults.PRESET_PREFIX)]
    return (f"tried to reach {what}, not in network.allow ({where}); to allow {them}, {fix}"
            + (f" ({'; '.join(via)})" if via else ""))


def direct_advice(hosts: list[str]) -> str:
    return (f"looked up {', '.join(hosts[:8])} itself instead of going through envgit's proxy "
            "(HTTPS_PROXY); inside the sandbox only the proxy reaches network.allow's hosts: "
            "configure the program to use the proxy")


@lru_cache(maxsize=16)
def _fix(path: str, sha256: str, entries: tuple) -> tuple[str, str]:
    """(where network.allow is, what to do there) for the policy file's current text (the
    sha256 keys the cache: an edited file is read again)."""
    quoted = [json.dumps(e) for e in entries]
    try:
        import yaml
        with open(path, encoding="utf-8") as f:
            text = f.read()
        root = yaml.compose(text)
    except Exception:
        return path, f"add {', '.join(quoted)} to network.allow"
    lines = text.splitlines()
    name = os.path.basename(path)              # the project's envgit.yaml
    _, network = _child(root, "network")
    if network is None:
        return (f"{name}: no network section",
                f"add this line at the end of {name}: `network: {{allow: [{', '.join(quoted)}]}}`")
    key, allow = _child(network, "allow")
    if allow is None:
        n = network.start_mark.line          # the `network:` key's value; the key is above
        if isinstance(network, yaml.MappingNode) and not network.flow_style and network.value:
            key = network.value[0][0]
            indent = " " * key.start_mark.column
            line = key.start_mark.line + 1
            return (f"{name}:{line}: network has no allow",
                    f"add this line before line {line}: `{indent}allow: [{', '.join(quoted)}]`")
        return (f"{name}:{n + 1}: network has no allow",
                f"add allow: [{', '.join(quoted)}] under network: at line {n + 1}")
    line = key.start_mark.line + 1
    if not isinstance(allow, yaml.SequenceNode):
        return f"{name}:{line}", f"make network.allow a list holding {', '.join(quoted)}"
    if allow.flow_style:
        at = allow.start_mark.line + 1
        if allow.start_mark.line != allow.end_mark.line or at > len(lines):
            return f"{name}:{line}", f"add {', '.join(quoted)} to the list that starts at line {at}"
        src = lines[at - 1]
        items = [text[i.start_mark.index:i.end_mark.index] for i in allow.value] + quoted
        new = src[:allow.start_mark.column] + "[" + ", ".join(items) + "]" + src[allow.end_mark.column:]
        return f"{name}:{line}", f"make line {at} read: `{new.rstrip()}`"
    last = allow.value[-1].end_mark.line + 1 if allow.value else line
    dash = " " * allow.start_mark.column
    if allow.value:                           # indented as the last entry's dash
        item = allow.value[-1].start_mark
        src = lines[item.line] if item.line < len(lines) else ""
        dash = " " * max(src.rfind("-", 0, item.column), 0)
    if len(quoted) == 1:
        return f"{name}:{line}", f"add this line after line {last}: `{dash}- {quoted[0]}`"
    return (f"{name}:{line}", f"add these lines after line {last}, one under the other: "
            + " and ".join(f"`{dash}- {q}`" for q in quoted))


def _child(node, key):
    """(key node, value node) of `key` in a mapping node, or (None, None)."""
    import yaml
    if not isinstance(node, yaml.MappingNode):
        return None, None
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None, None


def denial_notice(step, rec, policy, said, exact=False):
    """The line a step's stderr is shown for a denied request `rec` (None: said already this
    step, so a client's retries of a denied host are not said again; `said` is the step's
    record of what was). A host network.allow lacks is said with the line that allows it."""
    if not (rec.get("decision") == "deny" or rec.get("answer") == "deny") or rec.get("kind") == "signing":
        return None             # a refused signature is said by git's signing program itself
    if rec.get("rule") in ("network.allow", "builtin:special-address") and not rec.get("answer"):
        entry = rec["host"] if rec.get("port") in (None, 80, 443) else f"{rec['host']}:{rec['port']}"
        if entry in said:
            return None
        said.add(entry)
        offered, withheld = split_offered([entry])
        return f"envgit: step {step}: " + (advice(policy, offered, exact) if offered
                                           else withheld_notice(withheld))
    key = (rec.get("rule"), rec.get("method"), rec.get("host"))
    if key in said:
        return None
    said.add(key)
    what = f" ({rec['kind']})" if rec.get("kind") else ""
    return (f"envgit: denied {rec['method']} {rec['host']}{rec['path']}{what} by rule "
            f"{rec['rule']} (said once a step)")
