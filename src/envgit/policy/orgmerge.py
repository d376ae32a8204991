"""How the organisation policy and a project's envgit.yaml combine (org.py finds the
organisation's file and checks it can be trusted; load.py reads both): `combine`, rule by rule,
for every key of the format (docs/FORMAT.md "Organisation policy" has the table). A project can
tighten the organisation's policy, never loosen it: a project value that would loosen it is a
PolicyError naming the project's file and line and the organisation's. Pure but for resolving
names as the sandbox would (a credential file's symlinks, an MCP server's program on PATH)."""

import os

from .defaults import IRREVERSIBLE, NETWORK_PRESETS, PRESET_PREFIX
from .hostnames import canonical_host, split_entry
from .netpresets import PRESET_RULES, preset_rule_name
from .netrules import method_set
from .overlaps import env_overlap, host_entries_overlap, hosts_overlap, reopens
from .schema import PolicyError, where_line

# Irreversible actions, least to most strict: no rule, allow-and-mark, ask, deny.
STRICTNESS = {None: 0, "allow": 1, "ask": 2, "deny": 3}


class _Combiner:
    def __init__(self, org, owhere, proj, pwhere, home):
        self.o, self.ow, self.p, self.pw, self.home = org, owhere, proj, pwhere, home
        self.data: dict = {"version": 1}
        self.where: dict = {"version": pwhere.get("version", "")}

    def refuse(self, pkey, message):
        """A PolicyError at the project's value `pkey`."""
        f, n = where_line(self.pw.get(pkey) or self.pw.get(pkey.split("[")[0], ":0"))
        raise PolicyError(f, n, 1, message + " (an organisation policy can be tightened by a "
                          "project, never loosened)")

    def get(self, side, dotted, default=None):
        d = self.o if side == "o" else self.p
        for k in dotted.split("."):
            if not isinstance(d, dict) or k not in d:
                return default
            d = d[k]
        return d

    def put(self, dotted, value, where_value=None):
        *parents, last = dotted.split(".")
        d = self.data
        for k in parents:
            d = d.setdefault(k, {})
        d[last] = value
        if where_value is not None:
            self.where[dotted] = where_value

    def concat(self, dotted):
        """Org's entries then the project's, each keeping its own file:line."""
        items, n = [], 0
        for side, w in (("o", self.ow), ("p", self.pw)):
            for i, v in enumerate(self.get(side, dotted, [])):
                self.where[f"{dotted}[{n}]"] = w[f"{dotted}[{i}]"]
                items.append(v)
                n += 1
        if self.get("o", dotted) is not None or self.get("p", dotted) is not None:
            self.put(dotted, items)

    def both(self, dotted):
        a, b = self.ow.get(dotted), self.pw.get(dotted)
        return f"{a} + {b}" if a and b else a or b

    # --- each key ---------------------------------------------------------------------------

    def filesystem(self):
        for k in ("deny_read", "allow_read", "allow_write", "protect"):
            self.concat(f"filesystem.{k}")
        self.concat("escape_routes.allow")
        denies = [(d, self.ow[f"filesystem.deny_read[{i}]"])
                  for i, d in enumerate(self.get("o", "filesystem.deny_read", []))]
        for i, a in enumerate(self.get("p", "filesystem.allow_read", [])):
            for d, dw in denies:
                if reopens(a, d, self.home):
                    self.refuse(f"filesystem.allow_read[{i}]",
                                f"filesystem.allow_read re-opens {a}, which {dw} denies"
                                f"{_as(d, a)}; remove it")

    def env(self):
        self.concat("env.pass")
        self.concat("env.deny")
        odeny = [(d, self.ow[f"env.deny[{i}]"]) for i, d in enumerate(self.get("o", "env.deny", []))]
        for i, v in enumerate(self.get("p", "env.pass", [])):
            for d, dw in odeny:
                if env_overlap(v, d):
                    self.refuse(f"env.pass[{i}]", f"env.pass passes {v}, which {dw} denies"
                                f"{_as(d, v)}; remove it")
        oset, pset = self.get("o", "env.set", {}), self.get("p", "env.set", {})
        for name, value in pset.items():
            if name in oset and oset[name] != value:
                self.refuse(f"env.set.{name}", f"env.set changes {name}, which "
                            f"{self.ow[f'env.set.{name}']} sets to {oset[name]!r}; remove it")
            for d, dw in odeny:
                if env_overlap(name, d):
                    self.refuse(f"env.set.{name}", f"env.set sets {name}, which {dw} denies"
                                f"{_as(d, name)}; remove it")
        if self.get("o", "env.set") is not None or self.get("p", "env.set") is not None:
            self.put("env.set", {**pset, **oset}, self.both("env.set"))

    def network(self):
        self.concat("network.allow")
        self.concat("network.deny")
        self.concat("network.publish")
        odeny = [(d, self.ow[f"network.deny[{i}]"])
                 for i, d in enumerate(self.get("o", "network.deny", []))]
        for i, entry in enumerate(self.get("p", "network.allow", [])):
            hosts = NETWORK_PRESETS[entry[len(PRESET_PREFIX):]][0] \
                if entry.startswith(PRESET_PREFIX) else (entry,)
            for h in hosts:
                for d, dw in odeny:
                    if host_entries_overlap(h, d):
                        via = f" (through {entry})" if h != entry else ""
                        if split_entry(h)[0].startswith("*.") and split_entry(d)[0] != split_entry(h)[0]:
                            self.refuse(f"network.allow[{i}]", f"network.allow {h}{via} covers {d}, "
                                        f"which {dw} denies; name the hosts you need instead")
                        self.refuse(f"network.allow[{i}]", f"network.allow adds {h}{via}, which "
                                    f"{dw} denies{_as(d, h)}; remove it")
        ot, pt = self.get("o", "network.ask_timeout"), self.get("p", "network.ask_timeout")
        if pt is not None and ot is not None and pt > ot:
            self.refuse("network.ask_timeout", f"network.ask_timeout is {pt} s, longer than the "
                        f"{ot} s of {self.ow['network.ask_timeout']}; use at most {ot}")
        if pt is not None or ot is not None:
            self.put("network.ask_timeout", pt if pt is not None else ot,
                     self.pw["network.ask_timeout"] if pt is not None else self.ow["network.ask_timeout"])
        self.l7()

    def l7(self):
        ol, pl = self.get("o", "network.l7", {}), self.get("p", "network.l7", {})
        for key, spec in pl.items():
            for okey, ospec in ol.items():
                if not hosts_overlap(split_entry(key)[0], split_entry(okey)[0]):
                    continue
                ow = self.ow[f"network.l7.{okey}"]
                pk = f"network.l7.{key}"
                om, pm = ospec.get("methods"), spec.get("methods")
                if om is not None and "*" not in om:
                    extra = sorted(set(pm or ["*"]) - set(om))
                    if extra:
                        self.refuse(pk, f"network.l7[{key}] allows method {extra[0]}, which "
                                    f"{ow} does not ({okey}: {', '.join(om)}); list only those")
                op, pp = ospec.get("paths"), spec.get("paths")
                if op is not None:
                    extra = [p for p in (pp if pp is not None else ["/**"])
                             if not any(_path_within(p, o) for o in op)]
                    if extra:
                        self.refuse(pk, f"network.l7[{key}] allows path {extra[0]}, which {ow} "
                                    f"does not ({okey}: {', '.join(op)}); list only those")
                if spec.get("websocket") == "allow" and ospec.get("websocket") != "allow":
                    self.refuse(pk, f"network.l7[{key}] allows WebSocket upgrades, which {ow} "
                                f"does not ({okey}); remove it")
        if ol or pl:
            self.put("network.l7", {**ol, **pl}, self.both("network.l7"))

    def irreversible(self):
        """Preset rules: each at the stricter of the two actions (a project's looser one is an
        error). Request rules (`net:`): the organisation's, in its order, then the project's
        (first match wins): a request any organisation rule matches is decided as the
        organisation says; a project's rule decides only the rest, and cannot come before
        (and loosen) a stricter organisation preset rule it may match."""
        if self.get("o", "irreversible") is None and self.get("p", "irreversible") is None:
            return                                  # both the default: nothing to combine
        oent = self.get("o", "irreversible")
        pent = self.get("p", "irreversible")
        if pent is None:
            pent = oent if oent is not None else IRREVERSIBLE
        oacts = preset_actions(oent, self.ow, "irreversible") if oent is not None else {}
        pacts = preset_actions(pent, self.pw, "irreversible") \
            if self.get("p", "irreversible") is not None else {n: (a, "") for n, (a, _) in oacts.items()}
        combined = {}
        for d in PRESET_RULES:
            name = d["name"]
            oa, ow = oacts.get(name, (None, ""))
            pa, pw = pacts.get(name, (None, ""))
            if pa is None and not pw:
                pa = oa                 # the project's list does not speak of it: inherited
            if STRICTNESS[pa] < STRICTNESS[oa]:
                f, n = where_line(pw or self.pw.get("irreversible", ":0"))
                raise PolicyError(f, n, 1, f"irreversible makes preset rule {name} "
                                  f"{_verb(pa)}, which {ow} makes {_verb(oa)}; use "
                                  f"'action: {oa}' or stricter (an organisation policy can be "
                                  "tightened by a project, never loosened)")
            act = oa if STRICTNESS[oa] >= STRICTNESS[pa] else pa
            if act is not None:
                combined[name] = act
        nets = []
        for side, ents, w in (("o", oent or [], self.ow), ("p", self.get("p", "irreversible") or [], self.pw)):
            for i, e in enumerate(ents):
                if "net" in e:
                    nets.append((STRICTNESS[e["action"]], side, i, e, w[f"irreversible[{i}]"]))
        for strict, side, i, e, _where in nets:
            if side != "p":
                continue
            m = e["net"].get("method")
            for d in PRESET_RULES:
                act, act_where = oacts.get(d["name"], (None, ""))
                if STRICTNESS[act] <= strict:
                    continue
                methods = method_set(d.get("methods"))
                if m not in (None, "*") and (methods is not None and m.upper() not in methods or
                                             m.upper() in (method_set(d.get("not_methods")) or ())):
                    continue
                hosts = d.get("hosts")
                if hosts is not None and not any(hosts_overlap(split_entry(e["net"]["host"])[0], h)
                                                 for h in hosts):
                    continue
                self.refuse(f"irreversible[{i}]", f"irreversible[{i}] ({_verb(e['action'])}) can "
                            f"match requests before preset rule {d['name']}, which "
                            f"{act_where or self.ow.get('irreversible')} makes {_verb(act)}; use "
                            f"'action: {act}' or narrow its host and method")
        self._rules_within_l7(nets)
        out = [e for _, _, _, e, _ in nets] + [{"rule": f"preset:default/{n}", "action": a}
                                              for n, a in combined.items()]
        self.put("irreversible", out, self.both("irreversible"))

    def _rules_within_l7(self, nets):
        """A request rule is tried before `network.l7` (policy/network.py): a project's rule
        that allows or asks about a method or path an organisation's l7 entry leaves out would
        let it through (a person's yes included). Its host, method and path must be within."""
        ol = self.get("o", "network.l7", {})
        for _, side, i, e, _ in nets:
            if side != "p" or e["action"] == "deny":
                continue
            net = e["net"]
            for okey, ospec in ol.items():
                if not hosts_overlap(split_entry(net["host"])[0], split_entry(okey)[0]):
                    continue
                om, op = ospec.get("methods"), ospec.get("paths")
                m, path = (net.get("method") or "*").upper(), net.get("path") or "/**"
                bad = (f"method {m}" if om is not None and "*" not in om and m not in om else
                       f"path {path}" if op is not None and not any(_path_within(path, o) for o in op)
                       else None)
                if bad:
                    self.refuse(f"irreversible[{i}]", f"irreversible[{i}] ({_verb(e['action'])}) "
                                f"lets {bad} on {net['host']} through, which the l7 entry {okey} of "
                                f"{self.ow[f'network.l7.{okey}']} does not allow; use 'action: deny' "
                                "or stay within it")

    def rest(self):
        self.concat("shell")
        if "shell" in self.data:
            self.where["shell"] = self.both("shell")
        self.concat("snapshot.exclude")
        om, pm = self.get("o", "snapshot.max_file_size"), self.get("p", "snapshot.max_file_size")
        if om is not None and pm is not None and pm < om:
            self.refuse("snapshot.max_file_size", f"snapshot.max_file_size is {pm} bytes, less "
                        f"than the {om} of {self.ow['snapshot.max_file_size']}: snapshots would "
                        "record less than the organisation asks; use at least that")
        if om is not None or pm is not None:
            self.put("snapshot.max_file_size", pm if pm is not None else om,
                     self.pw.get("snapshot.max_file_size") if pm is not None
                     else self.ow["snapshot.max_file_size"])
        self.learn()
        self.signing()
        self.credentials()
        self.mcp()

    def signing(self):
        """The organisation's signing key, when it names one; else the project's."""
        osig, psig = self.get("o", "signing"), self.get("p", "signing")
        if osig is not None or psig is not None:
            self.put("signing", osig if osig is not None else psig,
                     self.ow.get("signing") if osig is not None else self.pw.get("signing"))

    def learn(self):
        """`learn: forbid` of the organisation's binds every project (policy/learn.py), as does
        its `degraded_sandbox: forbid` (sandbox/backend.py)."""
        for key, does in (("learn", "let steps run in learn mode"),
                          ("degraded_sandbox", "let steps run with Landlock where bubblewrap cannot")):
            ol, pl = self.get("o", key), self.get("p", key)
            if ol == "forbid" and pl == "allow":
                self.refuse(key, f"{key}: allow would {does}, which {self.ow[key]} forbids "
                            f"({key}: forbid); remove it")
            if ol == "forbid":
                self.put(key, ol, self.ow[key])
            elif pl is not None or ol is not None:
                self.put(key, pl if pl is not None else ol, self.pw[key] if pl is not None else self.ow[key])

    def credentials(self):
        oc, pc = self.get("o", "credentials", {}), self.get("p", "credentials", {})
        odeny = self.get("o", "env.deny", [])
        ondeny = self.get("o", "network.deny", [])
        for name, c in pc.items():
            key = f"credentials.{name}"
            if name in oc:
                self.refuse(key, f"credential {name} is defined by {self.ow[key]}; a project "
                            "cannot redefine it; use another name")
            src = c["from"]
            for oname, ocred in oc.items():
                if _source(ocred["from"], self.home) == _source(src, self.home):
                    kind = next(iter(src))
                    self.refuse(f"{key}.from.{kind}", f"credential {name} reads {kind} "
                                f"{src[kind]}, the source of credential {oname} of "
                                f"{self.ow[f'credentials.{oname}.from']}, which is sent only to "
                                f"{', '.join(ocred['hosts'])}; remove it (the organisation's "
                                f"{oname} already applies here)")
            for i, d in enumerate(odeny):
                if "env" in src and env_overlap(src["env"], d):
                    self.refuse(f"{key}.from.env", f"credential {name} reads {src['env']}, which "
                                f"{self.ow[f'env.deny[{i}]']} denies; remove it")
            for i, d in enumerate(self.get("o", "filesystem.deny_read", [])):
                if "file" in src and reopens(src["file"], d, self.home):
                    self.refuse(f"{key}.from.file", f"credential {name} reads {src['file']}, which "
                                f"{self.ow[f'filesystem.deny_read[{i}]']} denies; remove it")
            for j, h in enumerate(c["hosts"]):
                for i, d in enumerate(ondeny):
                    if host_entries_overlap(h, d):
                        self.refuse(f"{key}.hosts[{j}]", f"credential {name} is sent to {h}, which "
                                    f"{self.ow[f'network.deny[{i}]']} denies; remove it")
        if oc or pc:
            self.put("credentials", {**oc, **pc}, self.both("credentials"))

    def _org_mcp_rules(self, om, pm) -> list:
        """The organisation's mcp.rules, keyed by what a server is, not what it is called: a
        rule that names an organisation server also applies to a project server of the same
        upstream (mcp_identity) under another name, as a copy right after it (first match
        wins, so in the organisation's order, before every project rule)."""
        from fnmatch import fnmatchcase
        aliases = _aliases(om, pm)
        out = []
        for rule in om.get("rules", []):
            out.append(rule)
            pattern = rule.get("server", "*")
            for alias, onames in aliases.items():
                if not fnmatchcase(alias, pattern) and any(fnmatchcase(o, pattern) for o in onames):
                    out.append({**rule, "server": alias})
        return out

    def mcp(self):
        om, pm = self.get("o", "mcp"), self.get("p", "mcp")
        if om is None and pm is None:
            return
        om, pm = om or {}, pm or {}
        out = {**om, **pm}
        for name in pm.get("servers", {}):
            if name in om.get("servers", {}):
                self.refuse(f"mcp.servers.{name}", f"mcp server {name} is defined by "
                            f"{self.ow[f'mcp.servers.{name}']}; a project cannot redefine it")
        out["servers"] = {**om.get("servers", {}), **pm.get("servers", {})}
        # first match wins: the organisation's rules decide every call they match
        out["rules"] = self._org_mcp_rules(om, pm) + list(pm.get("rules", []))
        for k, lower_is_looser in (("max_return_bytes", False), ("flag_bytes_in", False),
                                   ("flag_bytes_out", True)):
            if k in om and k in pm and (pm[k] < om[k] if lower_is_looser else pm[k] > om[k]):
                self.refuse(f"mcp.{k}", f"mcp.{k} is {pm[k]}, {'below' if lower_is_looser else 'above'} "
                            f"the {om[k]} of {self.ow[f'mcp.{k}']}; an organisation's limit "
                            "cannot be loosened")
            if k in om and k not in pm:
                out[k] = om[k]
        self.put("mcp", out, self.both("mcp"))


def _source(src: dict, home: str) -> tuple:
    """Where a credential's real value comes from, one spelling per source: a file by its
    resolved path (~ expanded, symlinks followed), a command by its words; an env variable and
    an AWS profile by name. An organisation credential's source is sent only to its hosts."""
    kind, value = next(iter(src.items()))
    if kind == "file":
        path = home + value[1:] if value == "~" or value.startswith("~/") else value
        return kind, os.path.realpath(os.path.normpath(path))
    if kind == "command":
        return kind, " ".join(value.split())
    return kind, value


def mcp_identity(spec: dict) -> tuple:
    """What an MCP server is, whatever a policy names it: a stdio server's program (found on
    PATH, symlinks followed) and arguments (absolute paths normalised), an HTTP server's URL
    with its host as the gate compares hosts (hostnames.canonical_host) and the scheme's port."""
    import shutil
    from urllib.parse import urlsplit

    if "url" in spec:
        u = urlsplit(spec["url"].strip())
        scheme = u.scheme.lower()
        try:
            port = u.port or {"https": 443, "http": 80}.get(scheme)
        except ValueError:
            port = None
        return ("url", scheme, canonical_host(u.hostname or ""), port, u.path.rstrip("/") or "/", u.query)
    cmd = spec.get("command", "")
    prog = shutil.which(cmd) or cmd
    args = tuple(os.path.normpath(a) if a.startswith("/") else a for a in spec.get("args", ()))
    return ("command", os.path.realpath(prog) if prog.startswith("/") else prog, args)


def _aliases(om: dict, pm: dict) -> dict:
    """Project server name -> the organisation's server names of the same upstream
    (mcp_identity), for project servers named otherwise."""
    oids: dict = {}
    for n, spec in om.get("servers", {}).items():
        oids.setdefault(mcp_identity(spec), []).append(n)
    return {n: oids[i] for n, spec in pm.get("servers", {}).items()
            if (i := mcp_identity(spec)) in oids and n not in oids[i]}


def _path_within(path: str, org_path: str) -> bool:
    """Is every request path the l7 glob `path` admits also admitted by `org_path`? Judged
    soundly on the text: the same glob, or one under an org glob ending in '/**'."""
    if path == org_path:
        return True
    return org_path.endswith("/**") and path.startswith(org_path[:-2])


def _as(entry: str, value: str) -> str:
    """' (as ENTRY)' when the organisation's entry is not the value itself (a glob, a domain)."""
    return "" if entry == value else f" (as {entry})"


def _verb(action):
    return {None: "not apply", "allow": "allow-and-mark", "ask": "ask", "deny": "deny"}[action]


def preset_actions(entries, where, key) -> dict:
    """Preset rule name -> (action or None, 'file:line' that set it), as netrules._compile
    reads an irreversible list."""
    overrides, preset_action, preset_where, disabled = {}, None, "", {}
    for i, e in enumerate(entries):
        w = where.get(f"{key}[{i}]", "")
        if "rule" in e:
            name = preset_rule_name(e["rule"])
            if name:
                overrides[name] = (e["action"], w)
        elif "preset" in e:
            preset_action, preset_where = e.get("action", "deny"), w
            for n in e.get("disable", ()):
                disabled[preset_rule_name(n)] = w
    out = {}
    for d in PRESET_RULES:
        n = d["name"]
        if n in overrides:
            out[n] = overrides[n]
        elif preset_action is not None and n not in disabled:
            out[n] = (preset_action, preset_where)
        else:                           # a where: switched off there; none: never named
            out[n] = (None, disabled.get(n, preset_where))
    return out


def combine(org, owhere, proj, pwhere, home) -> tuple[dict, dict]:
    """(data, where) of the project's policy loaded under the organisation's, in the shape
    `validate` returns, each value's provenance naming its file and line."""
    c = _Combiner(org, owhere, proj, pwhere, home)
    c.filesystem()
    c.env()
    c.network()
    c.irreversible()
    c.rest()
    return c.data, c.where

