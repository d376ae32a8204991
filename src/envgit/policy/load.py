"""Reading envgit.yaml into the effective policy: the file's values merged over the defaults,
each value remembering where it came from."""

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import defaults
from .schema import MAX_BYTES, PolicyError, several, validate

MCP_DEFAULTS = {"servers": {}, "rules": [], "max_return_bytes": 20 * 1024,
                "flag_bytes_in": 100 * 1024, "flag_bytes_out": 1024}


@dataclass
class Policy:
    path: str                      # the file it was read from
    sha256: str                    # of the file's bytes: recorded on every step
    deny_read: list[str]
    allow_read: list[str]
    allow_write: list[str]
    protect: list[str]
    env_pass: list[str]
    env_set: dict[str, str]
    network_allow: list[str]
    l7: dict[str, dict]
    ask_timeout: int
    irreversible: list[dict]
    shell: list[dict]
    max_file_size: int
    snapshot_exclude: list[str]
    # dotted key (with [i] for list items) -> "default" or "envgit.yaml:LINE"
    where: dict[str, str] = field(default_factory=dict, repr=False)
    mcp: dict = field(default_factory=lambda: dict(MCP_DEFAULTS))   # envgit mcp's section
    # network.allow host -> the `preset:NAME` entry that brought it in (hosts named directly
    # are not here)
    allow_presets: dict[str, str] = field(default_factory=dict)
    # name -> {"from": {kind: value}, "hosts": [...], "methods"?: [...], "paths"?: [...]}:
    # where the daemon reads each real value, never the value (credentials/)
    credentials: dict = field(default_factory=dict)
    network_deny: list[str] = field(default_factory=list)   # also in irreversible, as rules
    network_publish: list = field(default_factory=list)   # ports steps publish (sandbox/publish.py)
    escape_routes_allow: list[str] = field(default_factory=list)   # routes a step may create
    env_deny: list[str] = field(default_factory=list)
    # every credential and MCP server the policy makes the host read, run or connect to
    # (policy/hostentries.py `named`: kind, name, where, org, text, digest): what `envgit
    # trust` approves and the readers and runners check (hostcmd/trust.py)
    host_entries: list[dict] = field(default_factory=list)
    org_credentials: list[str] = field(default_factory=list)   # names the organisation defines
    # the organisation policy this one was loaded under (policy/org.py), or ""
    org_path: str = ""
    org_sha256: str = ""
    # the person's own defaults this one was read over (policy/userdefaults.py), or ""
    user_path: str = ""
    user_sha256: str = ""
    learn: str = "allow"            # "forbid": no step runs in learn mode (policy/learn.py)
    degraded_sandbox: str = "allow"  # "forbid": no step runs with Landlock (sandbox/backend.py)
    signing: dict | None = None     # {key, action}: the gate signs commits and tags (proxy/sshsign.py)
    backend: str = "sandbox"        # "vm": steps run in the project's microVM (vm/)
    vm_memory: int = 512 << 20
    vm_cpus: int = 1
    vm_packages: list = field(default_factory=list)     # Debian packages added to the guest's tools

    def to_json(self) -> dict:
        return asdict(self)


def load_policy(path) -> Policy:
    """The effective policy of the file at `path`, read over the person's own defaults when
    there are some (policy/userdefaults.py) and loaded under the organisation policy when there
    is one (policy/org.py, orgmerge.py); PolicyError names file, line, column and fix (and
    holds every error of a file that has several: `envgit policy check` lists them)."""
    from . import hostentries, org, orgmerge, userdefaults, writes
    path = Path(path)
    project_root = os.path.dirname(os.path.abspath(path))
    home = os.path.expanduser("~")
    errors: list[PolicyError] = []
    data, where, sha = _read(path, errors=errors)
    if errors:                          # and what else the lines that did validate hold
        raise several(errors + writes.breaking(data, where, home, project_root))
    hostentries.refuse_in_project(where, path)
    user_path = userdefaults.locate(project_root)
    user_sha = ""
    if user_path is not None:
        udata, uwhere, user_sha = _read(Path(user_path))
        data, where = userdefaults.combine(udata, uwhere, data, where)
    entries = hostentries.named(data, where, org=False)
    org_path = org.locate(project_root)
    org_sha, org_creds = "", []
    if org_path is not None:
        odata, owhere, org_sha = _read(Path(org_path), label=org.shown(org_path))
        hostentries.check_org_ban(odata, owhere, entries)
        entries = hostentries.named(odata, owhere, org=True) + entries
        org_creds = sorted(odata.get("credentials") or {})
        data, where = orgmerge.combine(odata, owhere, data, where, os.path.expanduser("~"))
        org.check_unwritable(data, where, org_path, home, project_root)
    bad = writes.breaking(data, where, home, project_root)
    if bad:
        raise several(bad)
    userdefaults.check_unwritable(data, where, home, project_root)
    _credential_conflicts(data, where)
    pol = _merge(data, where, str(path), sha)
    pol.org_path, pol.org_sha256 = org.shown(org_path) if org_path else "", org_sha
    pol.user_path, pol.user_sha256 = user_path or "", user_sha
    pol.host_entries, pol.org_credentials = entries, org_creds
    return pol


def _read(path: Path, label=None, errors=None) -> tuple[dict, dict, str]:
    """One policy file checked against the format: (data, where, sha256 of its bytes). Errors
    and provenance name it `label` when given (the bucket object a local copy came from)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PolicyError(label or path, 0, 0, "no policy file; run `envgit init` to write the default "
                          "one") from None
    return parse(raw, label or path, errors)


def parse(raw: bytes, path, errors=None) -> tuple[dict, dict, str]:
    """A policy's bytes checked against the format: (data, where, sha256 of the bytes). Errors
    and provenance name it `path` (a file, or the bucket object the bytes came from). Every
    error of the format is found: with an `errors` list they are appended to it (the data is
    then what did validate), else the first is raised, holding them all."""
    import yaml
    if len(raw) > MAX_BYTES:          # refused before the YAML parser sees it (~1 s a MiB)
        raise PolicyError(path, raw[:MAX_BYTES].count(b"\n") + 1, 1,
                          f"the file is {len(raw)} bytes; a policy is at most {MAX_BYTES} bytes "
                          "(this line is where it passes that)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = _line_col(raw[:e.start].decode("utf-8", "replace"))
        raise PolicyError(path, line, col, f"not UTF-8 text (byte {e.start}, 0x{raw[e.start]:02x}); "
                          "save it as UTF-8") from None
    try:
        node = yaml.compose(text)
    except yaml.reader.ReaderError as e:        # a control character: YAML allows none
        line, col = _line_col(text[:e.position])
        raise PolicyError(path, line, col, f"a control character (U+{e.character:04X}) YAML does not "
                          "allow; remove it, or write it as an escape in a double-quoted string "
                          '("\\x01")') from None
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        raise PolicyError(path, m.line + 1 if m else 0, m.column + 1 if m else 0,
                          f"not valid YAML: {e.problem or e.context}; check the indentation "
                          "and quoting there") from None
    if node is None:
        raise PolicyError(path, 1, 1, "the file is empty; it needs at least 'version: 1' "
                          "(`envgit init --force` writes the default policy)")
    found: list[PolicyError] = []
    data, where = validate(node, str(path), found)
    if data.get("version", 1) != 1:
        found.append(PolicyError(path, int(where["version"].rsplit(":", 1)[1]), 1,
                                 f"version {data['version']} is not known to this envgit; use "
                                 "'version: 1'"))
    if errors is None and found:
        raise several(found)
    if errors is not None:
        errors += found
    return data, where, hashlib.sha256(raw).hexdigest()


def _line_col(before: str) -> tuple[int, int]:
    """(line, column), from 1, of the character after `before`."""
    return before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1


def _credential_conflicts(data, where) -> None:
    """A variable that is a credential's source cannot also be passed in: the real value
    would be inside, next to its placeholder."""
    sources = {c["from"]["env"]: name for name, c in data.get("credentials", {}).items()
               if "env" in c["from"]}
    for i, var in enumerate(data.get("env", {}).get("pass", [])):
        if var in sources:
            path, _, line = where[f"env.pass[{i}]"].rpartition(":")
            raise PolicyError(path, int(line), 1, f"env.pass names {var}, the source of credential "
                              f"'{sources[var]}': the real value would enter the sandbox; remove "
                              f"it from env.pass (steps get a placeholder in {var}, and the gate "
                              "sends the real value to the credential's hosts)")


def _merge(data, where, path, sha) -> Policy:
    fs, env, net, snap = (data.get(k, {}) for k in ("filesystem", "env", "network", "snapshot"))
    prov: dict[str, str] = {}

    def extend(key, base, extra):
        out, seen = [], set()           # a set: `v not in out` was quadratic in the list
        for v in base:
            if v not in seen:
                seen.add(v)
                prov[f"{key}[{len(out)}]"] = "default"
                out.append(v)
        for i, v in enumerate(extra):
            if v not in seen:
                seen.add(v)
                prov[f"{key}[{len(out)}]"] = where[f"{key}[{i}]"]
                out.append(v)
        return out

    def given(key, value, default):
        prov[key] = where.get(key, "default")
        return value if value is not None else default

    env_deny = env.get("deny", [])
    presets: dict[str, str] = {}      # host -> the preset entry that brought it in
    pol = Policy(
        path=path, sha256=sha,
        deny_read=extend("filesystem.deny_read", defaults.DENY_READ, fs.get("deny_read", [])),
        allow_read=extend("filesystem.allow_read", defaults.ALLOW_READ, fs.get("allow_read", [])),
        allow_write=extend("filesystem.allow_write", defaults.ALLOW_WRITE, fs.get("allow_write", [])),
        protect=extend("filesystem.protect", defaults.PROTECT, fs.get("protect", [])),
        env_pass=[v for v in extend("env.pass", defaults.ENV_PASS, env.get("pass", []))
                  if not any(_env_overlap(v, d) for d in env_deny)],
        env_set=given("env.set", env.get("set"), {}),
        network_allow=_network_allow(net.get("allow", []), where, prov, presets),
        l7=given("network.l7", net.get("l7"), {}),
        ask_timeout=given("network.ask_timeout", net.get("ask_timeout"), defaults.ASK_TIMEOUT_S),
        irreversible=_denied_hosts(net.get("deny", [])) +
        given("irreversible", data.get("irreversible"), defaults.IRREVERSIBLE),
        shell=given("shell", data.get("shell"), []),
        max_file_size=given("snapshot.max_file_size", snap.get("max_file_size"), defaults.MAX_FILE_SIZE),
        snapshot_exclude=extend("snapshot.exclude", [], snap.get("exclude", [])),
        escape_routes_allow=extend("escape_routes.allow", [], data.get("escape_routes", {}).get("allow", [])),
        mcp=given("mcp", {**MCP_DEFAULTS, **data["mcp"]} if "mcp" in data else None, dict(MCP_DEFAULTS)),
    )
    pol.network_deny = extend("network.deny", [], net.get("deny", []))
    pol.network_publish = extend("network.publish", [], net.get("publish", []))
    pol.env_deny = extend("env.deny", [], env_deny)
    if len(pol.env_pass) != len([k for k in prov if k.startswith("env.pass[")]):
        _reindex(prov, "env.pass", pol.env_pass, defaults.ENV_PASS, env.get("pass", []), where)
    pol.where = prov
    pol.allow_presets = presets
    pol.credentials = given("credentials", data.get("credentials"), {})
    vm = data.get("vm", {})
    pol.learn = given("learn", data.get("learn"), "allow")
    pol.degraded_sandbox = given("degraded_sandbox", data.get("degraded_sandbox"), "allow")
    pol.signing = given("signing", data.get("signing"), None)
    pol.backend = given("backend", data.get("backend"), "sandbox")
    pol.vm_memory = given("vm.memory", vm.get("memory"), 512 << 20)
    pol.vm_cpus = given("vm.cpus", vm.get("cpus"), 1)
    pol.vm_packages = extend("vm.packages", [], vm.get("packages", []))
    return pol


def _env_overlap(a, b):
    from .overlaps import env_overlap  # here, not at the top: it brings in the host parsing
    return env_overlap(a, b)


def _reindex(prov, key, kept, base, extra, where):
    """The provenance of `key` after env.deny dropped some of its entries."""
    for k in [k for k in prov if k.startswith(key + "[")]:
        del prov[k]
    src = dict.fromkeys(base, "default")
    for i, v in enumerate(extra):
        src.setdefault(v, where[f"{key}[{i}]"])
    for i, v in enumerate(kept):
        prov[f"{key}[{i}]"] = src[v]


def _denied_hosts(entries) -> list[dict]:
    """network.deny as request rules tried before every other: a host a wildcard (or the
    organisation's own allow) still reaches is terminated and each request to it refused."""
    return [{"name": f"network.deny {h}", "net": {"host": h}, "action": "deny"} for h in entries]


def _network_allow(entries, where, prov, presets) -> list[str]:
    """network.allow with each `preset:NAME` replaced by its hosts; each host's provenance is
    the line of its entry, and `presets` says which preset brought a host in."""
    out: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        preset = entry.startswith(defaults.PRESET_PREFIX)
        hosts = defaults.NETWORK_PRESETS[entry[len(defaults.PRESET_PREFIX):]][0] if preset else (entry,)
        for h in hosts:
            if h not in seen:
                seen.add(h)
                prov[f"network.allow[{len(out)}]"] = where[f"network.allow[{i}]"]
                if preset:
                    presets[h] = entry
                out.append(h)
    return out


def render(pol: Policy) -> str:
    """`envgit policy show`: every effective value beside where it came from."""
    lines = [f"# effective policy of {pol.path} (sha256 {pol.sha256[:12]})"]
    if pol.user_path:
        lines.append(f"# read over your defaults {pol.user_path} (sha256 {pol.user_sha256[:12]}): "
                     "their lists come first, the project's single values win")
    if pol.org_path:
        lines.append(f"# loaded under the organisation policy {pol.org_path} (sha256 "
                     f"{pol.org_sha256[:12]}): it can be tightened here, never loosened")
    width = 44
    for key, attr in [("filesystem.deny_read", "deny_read"), ("filesystem.allow_read", "allow_read"),
                      ("filesystem.allow_write", "allow_write"), ("filesystem.protect", "protect"),
                      ("env.pass", "env_pass"), ("env.deny", "env_deny"),
                      ("network.allow", "network_allow"), ("network.deny", "network_deny"),
                      ("snapshot.exclude", "snapshot_exclude"), ("escape_routes.allow", "escape_routes_allow")]:
        lines.append(f"{key}:")
        for i, v in enumerate(getattr(pol, attr)):
            via = f" ({pol.allow_presets[v]})" if attr == "network_allow" and v in pol.allow_presets else ""
            lines.append(f"  - {v:<{width}} # {pol.where[f'{key}[{i}]']}{via}")
    for key, attr in [("env.set", "env_set"), ("network.l7", "l7"), ("network.ask_timeout", "ask_timeout"),
                      ("irreversible", "irreversible"), ("shell", "shell"),
                      ("snapshot.max_file_size", "max_file_size"), ("mcp", "mcp")]:
        lines.append(f"{key}: {json.dumps(getattr(pol, attr))}  # {pol.where[key]}")
    for name, c in pol.credentials.items():
        (kind, source), = c["from"].items()
        narrow = "".join(f" {k}={','.join(c[k])}" for k in ("methods", "paths") if c.get(k))
        lines.append(f"credential {name}: from {kind} {source!r} to {', '.join(c['hosts'])}"
                     f"{narrow}  # {pol.where['credentials']}")
    if pol.signing:
        lines.append(f"signing: key {pol.signing['key']!r}, {pol.signing.get('action') or 'allow'}  "
                     f"# {pol.where.get('signing', '')}")
    lines.append("# network presets ('preset:NAME' in network.allow stands for these hosts):")
    lines += defaults.render_network_presets("#   ")
    return "\n".join(lines) + "\n"
