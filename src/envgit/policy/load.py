"""Reading envgit.yaml into the effective policy: the file's values merged over the defaults,
each value remembering where it came from."""

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import defaults
from .schema import MAX_BYTES, PolicyError, validate

POLICY_FILE = "envgit.yaml"
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

    def to_json(self) -> dict:
        return asdict(self)


def load_policy(path) -> Policy:
    """The effective policy of the file at `path`; PolicyError names file, line, column and fix."""
    import yaml
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise PolicyError(path, 0, 0, "no policy file; run `envgit init` to write the default one") from None
    if len(raw) > MAX_BYTES:          # refused before the YAML parser sees it (~1 s a MiB)
        raise PolicyError(path, raw[:MAX_BYTES].count(b"\n") + 1, 1,
                          f"the file is {len(raw)} bytes; a policy is at most {MAX_BYTES} bytes "
                          "(this line is where it passes that)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolicyError(path, 0, 0, f"not UTF-8 text (byte {e.start}); save it as UTF-8") from None
    try:
        node = yaml.compose(text)
    except yaml.MarkedYAMLError as e:
        m = e.problem_mark or e.context_mark
        raise PolicyError(path, m.line + 1 if m else 0, m.column + 1 if m else 0,
                          f"not valid YAML: {e.problem or e.context}; check the indentation "
                          "and quoting there") from None
    if node is None:
        raise PolicyError(path, 1, 1, "the file is empty; it needs at least 'version: 1' "
                          "(`envgit init --force` writes the default policy)")
    data, where = validate(node, str(path))
    if data["version"] != 1:
        raise PolicyError(path, int(where["version"].rsplit(":", 1)[1]), 1,
                          f"version {data['version']} is not known to this envgit; use 'version: 1'")
    _credential_conflicts(data, where, path)
    return _merge(data, where, str(path), hashlib.sha256(raw).hexdigest())


def _credential_conflicts(data, where, path) -> None:
    """A variable that is a credential's source cannot also be passed in: the real value
    would be inside, next to its placeholder."""
    sources = {c["from"]["env"]: name for name, c in data.get("credentials", {}).items()
               if "env" in c["from"]}
    for i, var in enumerate(data.get("env", {}).get("pass", [])):
        if var in sources:
            line = int(where[f"env.pass[{i}]"].rsplit(":", 1)[1])
            raise PolicyError(path, line, 1, f"env.pass names {var}, the source of credential "
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

    pol = Policy(
        path=path, sha256=sha,
        deny_read=extend("filesystem.deny_read", defaults.DENY_READ, fs.get("deny_read", [])),
        allow_read=extend("filesystem.allow_read", defaults.ALLOW_READ, fs.get("allow_read", [])),
        allow_write=extend("filesystem.allow_write", defaults.ALLOW_WRITE, fs.get("allow_write", [])),
        protect=extend("filesystem.protect", defaults.PROTECT, fs.get("protect", [])),
        env_pass=extend("env.pass", defaults.ENV_PASS, env.get("pass", [])),
        env_set=given("env.set", env.get("set"), {}),
        network_allow=_network_allow(net.get("allow", []), where, prov, presets := {}),
        l7=given("network.l7", net.get("l7"), {}),
        ask_timeout=given("network.ask_timeout", net.get("ask_timeout"), defaults.ASK_TIMEOUT_S),
        irreversible=given("irreversible", data.get("irreversible"), defaults.IRREVERSIBLE),
        shell=given("shell", data.get("shell"), []),
        max_file_size=given("snapshot.max_file_size", snap.get("max_file_size"), defaults.MAX_FILE_SIZE),
        snapshot_exclude=extend("snapshot.exclude", [], snap.get("exclude", [])),
        mcp=given("mcp", {**MCP_DEFAULTS, **data["mcp"]} if "mcp" in data else None, dict(MCP_DEFAULTS)),
    )
    pol.where = prov
    pol.allow_presets = presets
    pol.credentials = given("credentials", data.get("credentials"), {})
    return pol


def _network_allow(entries, where, prov, presets) -> list[str]:
    """network.allow with each `preset:NAME` replaced by its hosts; each host's provenance is
    the line of its entry, and `presets` says which preset brought a host in."""
    out, seen = [], set()
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
    width = 44
    for key, attr in [("filesystem.deny_read", "deny_read"), ("filesystem.allow_read", "allow_read"),
                      ("filesystem.allow_write", "allow_write"), ("filesystem.protect", "protect"),
                      ("env.pass", "env_pass"), ("network.allow", "network_allow"),
                      ("snapshot.exclude", "snapshot_exclude")]:
        lines.append(f"{key}:")
        for i, v in enumerate(getattr(pol, attr)):
            via = f" ({pol.allow_presets[v]})" if attr == "network_allow" and v in pol.allow_presets else ""
            lines.append(f"  - {v:<{width}} # {pol.where[f'{key}[{i}]']}{via}")
    for key, attr in [("env.set", "env_set"), ("network.l7", "l7"), ("network.ask_timeout", "ask_timeout"), ("irreversible", "irreversible"),
                      ("shell", "shell"), ("snapshot.max_file_size", "max_file_size"), ("mcp", "mcp")]:
        lines.append(f"{key}: {json.dumps(getattr(pol, attr))}  # {pol.where[key]}")
    for name, c in pol.credentials.items():
        (kind, source), = c["from"].items()
        narrow = "".join(f" {k}={','.join(c[k])}" for k in ("methods", "paths") if c.get(k))
        lines.append(f"credential {name}: from {kind} {source!r} to {', '.join(c['hosts'])}"
                     f"{narrow}  # {pol.where['credentials']}")
    lines.append("# network presets ('preset:NAME' in network.allow stands for these hosts):")
    lines += defaults.render_network_presets("#   ")
    return "\n".join(lines) + "\n"
