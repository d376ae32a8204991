"""The smallest change to envgit.yaml that lets through what the recorded steps needed
(`envgit policy suggest`). Pure: the policy, its file's text and the journal's request
records in; the new text, each added line with the steps that needed it, and what is not
suggested out. view/policyfigures.py reads the journal, loads the new text as a candidate and
replays it (policy/replay.py) before anything is written.

What was needed is what the policy in force refuses now, judged by the gate's own code
(replay.judge): a request denied or asked then that the file already allows is not needed
again, and a request learn mode let through (`learn: {decision, rule, kind, reason}`, with
decision "allow") is judged as it would be without it. Of those:

- a host not in network.allow: its registry preset when one names it (`preset:pypi`, not
  pypi.org and files.pythonhosted.org), else the host (with its port unless 443/80); for a
  host a preset does not name, an l7 rule narrowed to the methods and path prefixes seen (an
  API read with GET only gets `methods: [GET]`);
- a request an l7 rule of the file refused: that rule's methods and paths widened by what was
  seen, nothing else;
- never: what an irreversible rule refused or asked (listed "not suggested: irreversible",
  with its steps; that a host is not allowed hides the rule, so each request on a new host is
  judged again with the host allowed), a host hostnames.not_suggested refuses (an address, a
  private name), what the gate refused for its own reasons (a credential's misuse, an
  upgrade, an ambiguous path, SSH). Secret paths and credentials are not touched at all.
- never from a recorded value read as a pattern: a step chooses its method and path (a host
  too, as far as the gate lets it), so a host is suggested only as a literal name, an l7
  line names only the schema's methods (not `*`, NULL, an extension method) and path globs
  built from a path holding no glob character, of its first segment (MAX_SEGMENT characters
  at most; MAX_GLOBS per host); any other request is listed not suggested, with why.

Refused writes are not suggested: the journal records the denied paths a command line named,
not writes refused."""

from dataclasses import dataclass, field

import yaml

from . import yamledit
from .defaults import NETWORK_PRESETS, PRESET_PREFIX, presets_naming
from .hostnames import hostport, norm_host, not_suggested, rule_entry_matches
from .network import _l7_entry
from .replay import irreversible_rule, judge
from .schema import METHODS

# A step chooses what is recorded of its requests (method, path): a method a rule names is one
# of the schema's, literally; a path glob is built only from a path holding no glob character,
# of its literal first segment.
NAMED_METHODS = frozenset(METHODS) - {"*"}
GLOB_CHARS = frozenset("*?[]{}\\")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_")
MAX_SEGMENT = 200               # the longest first segment made into a path glob
MAX_GLOBS = 64                  # path globs suggested for one host, at most


@dataclass
class Line:
    """One addition to the file."""
    where: tuple                    # the keys of the list or mapping it goes in
    value: object                   # an allow entry; an l7 entry {methods, paths}; a list item
    key: str = ""                   # an l7 entry's host
    needs: list[tuple[int, dict]] = field(default_factory=list)   # (step, record) it is for
    line: int = 0                   # in the new text
    text: str = ""                  # what the line says, for people

    @property
    def steps(self) -> list[int]:
        return sorted({s for s, _ in self.needs})


@dataclass
class NotSuggested:
    why: str                        # "irreversible: git push", "an IP address", …
    rule: str
    needs: list[tuple[int, dict]] = field(default_factory=list)   # (step, record)

    @property
    def steps(self) -> list[int]:
        return sorted({s for s, _ in self.needs})

    @property
    def answers(self) -> dict | None:
        """How the asks among them were answered: {allow, deny, by_grant} (a remembered grant's
        allow counted in both), or None when none was asked."""
        asked = [r for _, r in self.needs if r.get("decision") == "ask"]
        if not asked:
            return None
        allowed = [r for r in asked if r.get("answer") == "allow"]
        return {"allow": len(allowed), "deny": len(asked) - len(allowed),
                "by_grant": sum(r.get("answered_how") == "grant" for r in allowed)}


@dataclass
class Suggestion:
    text: str                       # the file as it would be
    lines: list[Line]
    not_suggested: list[NotSuggested]

    @property
    def changed(self) -> bool:
        return bool(self.lines)


def effective(rec: dict) -> dict:
    """A record as the policy decided it: one learn mode let through carries the decision it
    would have had (`learn`), which is the one a replay compares with."""
    learn = rec.get("learn")
    if isinstance(learn, dict) and learn.get("decision") in ("deny", "ask"):
        return {**rec, **{k: learn.get(k) for k in ("decision", "rule", "kind", "reason")},
                "irreversible": False, "answer": None}
    return rec


def _decided(policy, rec: dict) -> tuple[str, str, bool, str]:
    """(action, rule, irreversible, what) of `rec` under `policy`: judged again, or as recorded
    when the record cannot be replayed."""
    eff = effective(rec)
    once = irreversible_rule(eff)
    o = judge(policy, rec)
    if o.now is None:
        return str(eff.get("decision") or ""), str(eff.get("rule") or ""), once, str(eff.get("kind") or "")
    d = o.now
    if once and d.action != "allow":    # an irreversible rule refused it then: it stays so
        return d.action, str(eff.get("rule")), True, str(eff.get("kind") or "")
    return d.action, d.rule, d.irreversible, d.kind


def _entry_for(policy, host: str, port: int) -> str:
    """The allow entry for host:port: its preset, unless `network.deny` (the file's, your
    defaults', the organisation's) refuses a host of it, which would not load."""
    presets = [p for p in (presets_naming(host) if port in (80, 443) else [])
               if not any(rule_entry_matches(d, h, 443) for d in policy.network_deny for h in _hosts_of(p))]
    return presets[0] if presets else (host if port in (80, 443) else hostport(host, port))


def _hosts_of(entry: str) -> list[str]:
    if entry.startswith(PRESET_PREFIX):
        return list(NETWORK_PRESETS[entry[len(PRESET_PREFIX):]][0])
    return [entry]


def _literal_host(host: str) -> bool:
    """Is `host` a DNS name as written, no pattern (`*.com` is an allow entry's wildcard)?"""
    return len(host) <= 253 and all(
        0 < len(label) <= 63 and set(label) <= _NAME_CHARS for label in host.split("."))


def _head(path) -> tuple[str, bool]:
    """(first segment, more after it) of a recorded path, its query left out."""
    p = str(path or "/").split("?", 1)[0] or "/"
    head, _, rest = p.lstrip("/").partition("/")
    return head, bool(rest) or (p.endswith("/") and bool(head))


def path_globs(paths) -> list[str]:
    """The narrowest path globs of one segment's depth that cover `paths`: `/items` and
    `/items/1` give `/items` and `/items/**` (`**` never matches the bare prefix). Only for
    paths `_unnamed` passed: their first segment is literal."""
    out: set[str] = set()
    for p in paths:
        head, more = _head(p)
        out.add("/" if not head else f"/{head}/**" if more else f"/{head}")
    return sorted(out)


def _methods(rec: dict) -> set[str]:
    """The methods a request acted as (its own and, from the facts, another it was read as)."""
    facts = rec.get("facts")
    others = facts.get("methods") if isinstance(facts, dict) else None
    # the method as the step sent it (a record's `method` is mitmproxy's Unicode upper case:
    # `poſt` reads POST), and upper case by ASCII only: never a method the step did not send
    return {_ascii_upper(rec.get("method_sent") or rec.get("method"))} | {
        _ascii_upper(m) for m in (others if isinstance(others, list | tuple) else ())}


def _ascii_upper(method) -> str:
    m = str(method or "")
    return m.upper() if m.isascii() else m


def _unnamed(rec: dict) -> str:
    """Why no l7 line is made for `rec` ("" when one can be): a method a rule cannot name
    literally (`*`, NULL, an extension method), or a path a glob would read as more than
    itself (its first segment becomes the glob's text). A step chooses both."""
    if not _methods(rec) <= NAMED_METHODS:
        return ("a method a rule cannot name (network.l7 methods are " +
                ", ".join(m for m in METHODS if m in NAMED_METHODS) + "): name it yourself if you mean it")
    head, _ = _head(rec.get("path"))
    if GLOB_CHARS & set(str(rec.get("path") or "").split("?", 1)[0]) or not head.isprintable():
        return ("a path holding a glob character (* ? [ ] { } \\) or a control character: a "
                "recorded path is never made a pattern; name it in network.l7 yourself if you mean it")
    if not head.isascii():
        return ("a path with a character that is not ASCII: a path glob matches without regard to "
                "case, and Unicode's case folding (ſ to s) would let it admit other paths; name it "
                "in network.l7 yourself")
    if len(head) > MAX_SEGMENT:
        return f"a path whose first segment is over {MAX_SEGMENT} characters: name it in network.l7 yourself"
    return ""


def _named(needs, rule: str, refuse) -> list:
    """`needs` ((step, record)) an l7 line can be made for; the others refused, said why, and
    past MAX_GLOBS path globs the rest of a host's too (a step could record any number)."""
    kept, globs = [], set[str]()
    for step, rec in needs:
        if str(rec.get("method") or "").upper() == "CONNECT":
            kept.append((step, rec))            # a tunnel: nothing of its requests was seen
            continue
        why = _unnamed(rec)
        glob = path_globs([rec.get("path")])[0] if not why else ""
        if not why and glob not in globs and len(globs) >= MAX_GLOBS:
            why = f"over {MAX_GLOBS} path prefixes on one host: name them in network.l7 yourself"
        if why:
            refuse(why, rule, step, rec)
        else:
            globs.add(glob)
            kept.append((step, rec))
    return kept


def suggest(policy, text: str, steps) -> Suggestion:
    """`steps`: [(step, [request record, ...])] (view/policyfigures.recorded). `policy`: the
    policy loaded from `text` (with the defaults and organisation it was loaded under)."""
    import dataclasses
    refused: dict[tuple, NotSuggested] = {}
    new_hosts: dict[str, list] = {}         # allow entry -> [(step, rec)]
    l7_wider: dict[str, list] = {}          # existing l7 key -> [(step, rec)]

    # the l7 entries this file has (one of your defaults' is replaced whole by the file's)
    own_l7 = set(((yaml.safe_load(text) or {}).get("network") or {}).get("l7") or {})

    def refuse(why, rule, step, rec):
        refused.setdefault((why, rule), NotSuggested(why, rule)).needs.append((step, rec))

    for step, records in steps:
        for rec in records:
            action, rule, irreversible, kind = _decided(policy, rec)
            if action == "allow":
                continue
            # (git over ssh: the port it was judged on, proxy/sshgit.py's `judged_as`)
            port = int((rec.get("judged_as") or rec).get("port") or 0)
            host = norm_host(str(rec.get("host") or ""))
            if irreversible:
                refuse(f"irreversible: {kind or rule}", rule, step, rec)
            elif rule == "network.allow" and not_suggested(host):
                refuse(f"{host} is {not_suggested(host)}: name it in network.allow yourself "
                       "if you mean it", rule, step, rec)
            elif rule == "network.allow" and not _literal_host(host):
                refuse("a host that is not a literal name (a glob character, or a character no "
                       "name holds): name it in network.allow yourself if you mean it", rule, step, rec)
            elif rule == "network.allow":
                new_hosts.setdefault(_entry_for(policy, host, port), []).append((step, rec))
            elif rule.startswith("network.l7[") and rule[11:-1] in own_l7:
                l7_wider.setdefault(rule[11:-1], []).append((step, rec))
            elif rule.startswith("network.l7["):
                refuse(f"{rule} is not this file's (your defaults' or the organisation's): "
                       "widen it there", rule, step, rec)
            else:
                refuse(f"refused by the gate ({rule})", rule, step, rec)

    # With the new hosts allowed, a request there may meet an irreversible rule: never suggested
    probe = dataclasses.replace(policy, network_allow=list(policy.network_allow) + [
        h for e in new_hosts for h in _hosts_of(e)])
    for entry in list(new_hosts):
        kept = []
        for step, rec in new_hosts[entry]:
            action, rule, irreversible, kind = _decided(probe, rec)
            if irreversible and action != "allow":
                refuse(f"irreversible: {kind or rule}", rule, step, rec)
            else:
                kept.append((step, rec))
        if kept:
            new_hosts[entry] = kept
        else:
            del new_hosts[entry]

    lines: list[Line] = []
    for entry, needs in new_hosts.items():
        if not entry.startswith(PRESET_PREFIX):
            needs = _named(needs, "network.allow", refuse)
            if not needs:
                continue
        lines.append(Line(("network", "allow"), entry, needs=needs, text=entry))
        seen = [rec for _, rec in needs if str(rec.get("method") or "").upper() != "CONNECT"]
        if entry.startswith(PRESET_PREFIX) or len(seen) < len(needs) or _l7_names(policy, needs):
            continue                # a tunnel refused before its requests: nothing seen to narrow to
        narrowed = {"methods": sorted(set().union(*(_methods(r) for r in seen))),
                    "paths": path_globs(r.get("path") or "/" for r in seen)}
        lines.append(Line(("network", "l7"), narrowed, key=entry, needs=needs,
                          text=f"{entry}: {yamledit.scalar(narrowed)}"))
    for key, needs in l7_wider.items():
        spec = policy.l7[key]
        needs = _named(needs, f"network.l7[{key}]", refuse)
        for name, want in (("methods", sorted(set().union(*(_methods(r) for _, r in needs)))),
                           ("paths", path_globs(r.get("path") or "/" for _, r in needs))):
            have = spec.get(name)
            if have is None or (name == "methods" and "*" in have):
                continue            # the rule does not narrow by it
            for v in want:
                if v in have:
                    continue
                lines.append(Line(("network", "l7", key, name), v, text=f"{key} {name}: {v}", needs=[
                    (s, r) for s, r in needs if (v in _methods(r) if name == "methods"
                                                 else path_globs([r.get("path") or "/"]) == [v])]))

    new = text
    for line in lines:
        if line.key:
            new = yamledit.add_entry(new, line.where, line.key, line.value)
        else:
            new = yamledit.append(new, line.where, [line.value])
    for line in lines:
        line.line = yamledit.line_of(new, line.where, line.key or line.value)
    return Suggestion(new, lines, list(refused.values()))


def as_policy(policy, sug: Suggestion):
    """`policy` with the suggestion's lines in it, as loading the suggested file would give
    them (network.allow with a preset's hosts, the file's l7 entries): for the counts of
    `envgit stats` and the page, which must not write a file to load one. `envgit policy
    suggest` loads the file's text itself (an organisation's refusal is seen only there)."""
    import dataclasses
    allow = list(policy.network_allow)
    l7 = {k: dict(v) for k, v in policy.l7.items()}
    for ln in sug.lines:
        if ln.where == ("network", "allow"):
            allow += [h for h in _hosts_of(str(ln.value)) if h not in allow]
        elif ln.where == ("network", "l7"):
            l7[ln.key] = dict(ln.value) if isinstance(ln.value, dict) else {}
        else:
            key, name = ln.where[2], ln.where[3]
            l7[key] = {**l7[key], name: [*l7[key][name], ln.value]}
    return dataclasses.replace(policy, network_allow=allow, l7=l7)


def _l7_names(policy, needs) -> bool:
    """Does an l7 key already apply to every host:port of `needs`, as the gate looks one up
    (a key with a port names that port only)?"""
    return all(_l7_entry(policy, str(r.get("host") or ""), int(r.get("port") or 0)) is not None
               for _, r in needs)


def shown(rec: dict) -> str:
    """A request as a person reads it: METHOD host[:port]/path (its query left out). A step
    chose every part: a character that is not text (a lone surrogate) is shown escaped."""
    port = rec.get("port")
    where = f"{rec.get('host')}{'' if port in (80, 443, None) else f':{port}'}"
    path = str(rec.get("path") or "").split("?", 1)[0]
    text = f"{rec.get('method')} {where}{path}"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
