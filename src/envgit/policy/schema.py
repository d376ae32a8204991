"""The envgit.yaml format, declared once: validation (with file:line:col errors) and the
published JSON Schema both come from the declarations below.

Validation walks the YAML *node* tree (yaml.compose), not the loaded data, so that every
error can name the line and column of the offending key or value.
"""

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .globs import GlobError, compile_glob


class PolicyError(ValueError):
    """A policy that cannot be used; str() is `file:line:col: message`. `errors` is every error
    found in the file (this one first): `envgit policy check` lists them all."""

    def __init__(self, path, line, col, message):
        self.path, self.line, self.col, self.message = path, line, col, message
        where = f"{path}:{line}:{col}" if line else str(path)
        self.errors: list[PolicyError] = [self]
        super().__init__(f"{where}: {message}")


def several(errors: list[PolicyError]) -> PolicyError:
    """One PolicyError for a file with `errors` (in the order found): the first, saying how many
    more there are, with every one in `errors`."""
    if len(errors) == 1:
        return errors[0]
    first = errors[0]
    more = len(errors) - 1
    e = PolicyError(first.path, first.line, first.col, f"{first.message} ({more} more "
                    f"error{'s' if more > 1 else ''}: `envgit policy check` lists them)")
    e.errors = list(errors)
    return e


def where_line(where_value: str) -> tuple[str, int]:
    """(file, line) of a provenance value `file:LINE` (validate's `where`; line 0 if none)."""
    f, _, n = where_value.rpartition(":")
    return f, int(n) if n.isdigit() else 0


# --- value types -------------------------------------------------------------------------

@dataclass
class Str:
    doc: str = ""
    check: Callable[[str], str | None] | None = None   # returns an error message or None
    enum: tuple[str, ...] = ()

    def json(self):
        s = {"type": "string", "description": self.doc}
        if self.enum:
            s["enum"] = list(self.enum)
        return s


@dataclass
class AllowEntry(Str):
    """A network.allow entry: a host entry, or `preset:NAME` (policy/defaults.py NETWORK_PRESETS)."""

    def json(self):
        from .defaults import NETWORK_PRESETS, PRESET_PREFIX
        return {"description": self.doc, "anyOf": [
            *({"const": PRESET_PREFIX + n, "description": f"{why}: {', '.join(hosts)}"}
              for n, (hosts, why) in NETWORK_PRESETS.items()),
            {"type": "string", "not": {"pattern": "^" + PRESET_PREFIX},
             "description": "'host', 'host:port', '[v6]:port' or '*.domain'"}]}


@dataclass
class Int:
    doc: str = ""
    minimum: int = 0

    def json(self):
        return {"type": "integer", "minimum": self.minimum, "description": self.doc}


@dataclass
class Size:
    """A byte count: an integer or a string like `256MiB`."""
    doc: str = ""

    def json(self):
        return {"type": ["integer", "string"], "pattern": _SIZE_RE.pattern, "description": self.doc}


@dataclass
class Port:
    """A published port: PORT (an integer) or "HOST_PORT:STEP_PORT" (policy/ports.py)."""
    doc: str = ""

    def json(self):
        return {"type": ["integer", "string"], "pattern": "^([0-9]+:)?[0-9]+$", "description": self.doc}


@dataclass
class List:
    item: Any
    doc: str = ""

    def json(self):
        return {"type": "array", "items": self.item.json(), "description": self.doc}


@dataclass
class Map:
    fields: dict
    doc: str = ""
    required: tuple[str, ...] = ()

    def json(self):
        return {"type": "object", "description": self.doc, "additionalProperties": False,
                "required": list(self.required),
                "properties": {k: v.json() for k, v in self.fields.items()}}


@dataclass
class Dict:
    """A mapping with free keys (host names) and typed values."""
    key: Str
    value: Any
    doc: str = ""

    def json(self):
        return {"type": "object", "description": self.doc, "additionalProperties": self.value.json()}


@dataclass
class OneOf:
    """A mapping told apart by which discriminating key it has (`preset:` vs `net:` …)."""
    choices: dict            # discriminating key -> Map
    doc: str = ""

    def json(self):
        return {"description": self.doc, "oneOf": [m.json() for m in self.choices.values()]}


# --- checks ------------------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|K|M|G|T)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2,
          "mb": 1000**2, "g": 1024**3, "gib": 1024**3, "gb": 1000**3, "t": 1024**4,
          "tib": 1024**4, "tb": 1000**4}
_HOST_RE = re.compile(r"^(\*\.)?[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:\d{1,5})?$")
_IP6_RE = re.compile(r"^\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE", "*")
ACTIONS = ("deny", "ask", "allow")


def parse_size(text) -> int:
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write e.g. 256MiB")
    return int(m.group(1)) * _UNITS[(m.group(2) or "").lower()]


def check_glob(text):
    try:
        compile_glob(text.removeprefix("~/").lstrip("/") or "x")
    except GlobError as e:
        return f"bad glob {text!r}: {e}"
    return None


def check_host(text):
    if _HOST_RE.match(text) or _IP6_RE.match(text):
        port = text.rsplit(":", 1)[1] if text.count(":") == 1 or text.startswith("[") and "]:" in text else None
        if port is not None and not 0 < int(port) < 65536:
            return f"port {port} is out of range in {text!r}"
        return None
    return f"{text!r} is not a host: write 'example.com', 'example.com:443' or '*.example.com'"


def check_allow_entry(text):
    from .defaults import NETWORK_PRESETS, PRESET_PREFIX
    if not text.startswith(PRESET_PREFIX):
        return check_host(text)
    name = text[len(PRESET_PREFIX):]
    if name in NETWORK_PRESETS:
        return None
    hint = difflib.get_close_matches(name, NETWORK_PRESETS, n=1)
    fix = f"did you mean '{PRESET_PREFIX}{hint[0]}'?" if hint else \
        "the presets: " + ", ".join(PRESET_PREFIX + n for n in NETWORK_PRESETS)
    return f"{text!r} is not a network preset; {fix} (`envgit policy show` lists their hosts)"


def check_preset_rule(text):
    from .netpresets import PRESET_NAMES, preset_rule_name  # pure and light, but not needed earlier
    if preset_rule_name(text):
        return None
    hint = difflib.get_close_matches(text.rsplit("/", 1)[-1], PRESET_NAMES, n=1)
    fix = f"did you mean '{hint[0]}'?" if hint else "the preset's rules: " + ", ".join(PRESET_NAMES)
    return f"{text!r} is not a rule of preset default; {fix}"


def check_env_name(text):
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*\*?$", text):
        return None
    return f"{text!r} is not an environment variable name (a trailing * is allowed: LC_*)"


def check_identifier(text):
    if re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", text):
        return None
    return f"{text!r} is not a name the code can call it by (letters, digits, _)"


def check_debian_package(text):
    if re.match(r"^[a-z0-9][a-z0-9+.-]+$", text):
        return None
    return (f"{text!r} is not a Debian package name (lowercase letters, digits, + - .; "
            "`apt-cache search` finds one)")


def check_shell_pattern(text):
    import shlex
    try:
        return None if shlex.split(text) else "an empty pattern matches nothing; remove it"
    except ValueError as e:
        return f"cannot be split into words ({e}); close the quote"


def check_path_glob(text):
    if text.startswith("/") or text.startswith("~/") or text == "~":
        return None if "**" not in text else f"'**' only works in project patterns, not in {text!r}"
    return check_glob(text)


# --- the format --------------------------------------------------------------------------

NET_MATCH = Map({
    "host": Str("host the rule applies to ('*.example.com' allowed)", check=check_host),
    "method": Str("HTTP method, or '*'", enum=METHODS),
    "path": Str("path glob; '*' stays within a segment, '**' crosses segments"),
}, doc="which requests the rule matches", required=("host",))

BODY_MATCH = Map({
    "graphql": Str("the GraphQL operation type that matches", enum=("mutation", "subscription")),
}, doc="match on the decoded request body")

SCHEMA = Map({
    "version": Int("format version; always 1", minimum=1),
    "filesystem": Map({
        "deny_read": List(Str(check=check_path_glob), doc=(
            "paths that cannot be read inside the sandbox, added to the defaults: '~/x' and "
            "'/x' are absolute, anything else is a project glob ('**/.env'); named groups: "
            "browser-profiles, shell-history")),
        "allow_read": List(Str(check=check_path_glob), doc=(
            "re-allows paths a default deny would close, and makes extra host paths visible "
            "(read-only) inside the sandbox")),
        "allow_write": List(Str(check=check_path_glob), doc=(
            "writable paths besides the per-session /tmp; '.' is the project")),
        "protect": List(Str(check=check_path_glob), doc=(
            "read-only paths inside the writable project, added to the defaults")),
    }, doc="what the sandbox can read and write"),
    "env": Map({
        "pass": List(Str(check=check_env_name), doc=(
            "variables passed into the sandbox (added to the defaults); a secret-looking name "
            "(*_TOKEN, *_SECRET, *_KEY, *PASSWORD*) passes only when named exactly")),
        "set": Dict(Str(check=check_env_name), Str(), doc="variables set inside the sandbox"),
        "deny": List(Str(check=check_env_name), doc=(
            "variables never passed into the sandbox (a trailing * is allowed): a default pass "
            "they cover is dropped; in an organisation policy, a project's env.pass, env.set or "
            "credential naming one is an error")),
    }, doc="the sandbox's environment"),
    "network": Map({
        "allow": List(AllowEntry(check=check_allow_entry), doc=(
            "hosts reachable through the proxy: 'host' (ports 443 and 80), 'host:port', "
            "'*.domain', or 'preset:NAME' for every host a client needs (preset:pypi, "
            "preset:npm, preset:github, …); a loopback entry with a port ('localhost:5173') "
            "is reachable from inside at that address and port")),
        "deny": List(Str(check=check_host), doc=(
            "hosts never reachable, whatever network.allow says ('host', 'host:port', "
            "'*.domain'): a request to one is refused at the gate; in an organisation policy, a "
            "project's network.allow naming or covering one is an error")),
        "ask_timeout": Int("seconds an `ask` waits for a person before it is a deny", minimum=1),
        "publish": List(Port(), doc=(
            "ports a step's server is reached at from the host's 127.0.0.1 while the step runs: "
            "PORT or 'HOST_PORT:STEP_PORT' (as `envgit run -p`); not a port a loopback entry "
            "of network.allow names")),
        "l7": Dict(Str(check=check_host), Map({
            "methods": List(Str(enum=METHODS)),
            "paths": List(Str()),
            "websocket": Str("'allow': WebSocket upgrades to this host go through (the handshake "
                             "is judged, the messages after it are not); otherwise refused",
                             enum=("allow", "deny")),
        }), doc="request-level rules per host; TLS is terminated for these hosts"),
    }, doc="network reach (enforced by the proxy)"),
    "irreversible": List(OneOf({
        "preset": Map({
            "preset": Str("a named rule set", enum=("default",)),
            "action": Str("action for every rule of the preset", enum=ACTIONS),
            "disable": List(Str(check=check_preset_rule), doc="preset rule names to switch off"),
        }, required=("preset",)),
        "net": Map({
            "name": Str("a name to cite the rule by"),
            "net": NET_MATCH,
            "body": BODY_MATCH,
            "action": Str(enum=ACTIONS),
        }, required=("net", "action")),
        "rule": Map({
            "rule": Str("the name of a preset rule (git-push, npm-publish, …)", check=check_preset_rule),
            "action": Str(enum=ACTIONS),
        }, required=("rule", "action")),
    }, doc="an irreversible action: a preset, a request rule, or an override of a preset rule"),
        doc="actions that cannot be taken back: deny, ask, or allow-and-mark"),
    "shell": List(OneOf({
        "deny": Map({"deny": List(Str(check=check_shell_pattern)), "reason": Str()}, required=("deny",)),
    }), doc="early refusal of matching command lines (a courtesy; the network rule enforces)"),
    "snapshot": Map({
        "max_file_size": Size("files larger than this are left out of snapshots (and said so)"),
        "exclude": List(Str(check=check_glob), doc="project globs left out of snapshots"),
    }, doc="what the snapshot after each step holds"),
    "credentials": Dict(Str(check=check_identifier), Map({
        "from": OneOf({
            "env": Map({"env": Str("a variable of the daemon's environment (the person's "
                                   "`envgit run`)", check=check_env_name)}, required=("env",)),
            "command": Map({"command": Str("a command run on the host, outside the sandbox; its "
                                           "output, once a session, is the value")}, required=("command",)),
            "file": Map({"file": Str("a file on the host ('~/' allowed) holding the value")},
                        required=("file",)),
            "profile": Map({"profile": Str("an AWS profile of ~/.aws, read by the daemon")},
                           required=("profile",)),
        }, doc="where the daemon reads the real value (never the sandbox)"),
        "hosts": List(Str(check=check_host), doc="the only hosts the real value is sent to"),
        "methods": List(Str(enum=METHODS), doc="optional: only these methods get it"),
        "paths": List(Str(), doc="optional: only these path globs get it"),
    }, required=("from", "hosts")), doc=(
        "credentials kept outside the sandbox: a step sees a placeholder, the gate swaps in the "
        "real value only on allowed requests to the credential's hosts")),
    "project_host_commands": Str(
        "organisation policy only: 'deny' refuses every project policy that names a host command "
        "(a credential's `from: command`, an MCP server's `command`); 'trust' (the default) runs "
        "a project's once the person approved its exact text with `envgit trust`",
        enum=("trust", "deny")),
    "signing": Map({
        "key": Str("the SSH key that signs (a private key file, or its .pub with the key in your "
                   "ssh-agent), on the host ('~/' allowed); a step never reads it"),
        "action": Str("'allow' (the default): sign and record; 'ask': each signature is asked "
                      "first (envgit approve, the page)", enum=("allow", "ask")),
    }, required=("key",), doc=(
        "commits and tags a step signs (`git commit -S`, commit.gpgsign) are signed by the "
        "gate with this key: only commit and tag payloads, each recorded on its step; used once "
        "you approved it with `envgit trust` (an organisation's is its own)")),
    "learn": Str(
        "'forbid': no step runs in learn mode (`envgit learn`, `--learn`) under this policy; a "
        "project or your defaults cannot undo an organisation's 'forbid'; 'allow' (the default) "
        "lets a person switch it on", enum=("allow", "forbid")),
    "degraded_sandbox": Str(
        "where the host refuses the user namespaces bubblewrap needs, steps run with Landlock + "
        "seccomp, which is weaker (each step records how; `envgit doctor` says it): 'allow' (the "
        "default) runs them so; 'forbid' refuses every step there instead; a project or your "
        "defaults cannot undo an organisation's 'forbid'", enum=("allow", "forbid")),
    "escape_routes": Map({
        "allow": List(Str(check=check_path_glob), doc=(
            "project globs of escape routes (`envgit policy protected`) a step may create: "
            "marked and told, left in place; any other a step creates is taken back at its "
            "end")),
    }, doc="files a program outside the sandbox obeys"),
    "backend": Str("where steps run: 'sandbox' (bubblewrap, the default) or 'vm' (a microVM "
                   "whose memory is snapshotted with each step, so a rewind brings back running "
                   "processes)", enum=("sandbox", "vm")),
    "vm": Map({
        "memory": Size("the guest's RAM (default 512MiB); a snapshot costs what the guest touched"),
        "cpus": Int("the guest's CPUs (default 1)", minimum=1),
        "packages": List(Str(check=check_debian_package), doc=(
            "Debian packages added to the guest's tools (with their dependencies) besides bash, "
            "coreutils, git, curl, make, procps, python3 and pip; a changed list is built on "
            "the next boot")),
    }, doc="the VM backend's machine (backend: vm)"),
    "mcp": Map({
        "servers": Dict(Str(check=check_identifier), Map({
            "command": Str("the program of a stdio server"),
            "args": List(Str(), doc="its arguments"),
            "env": Dict(Str(check=check_env_name), Str(), doc=(
                "its environment, added to envgit mcp's own; '${NAME}' is taken from envgit mcp's "
                "environment, so a token need not be written here")),
            "url": Str("the URL of a streamable HTTP server (instead of command)"),
        }), doc="upstream MCP servers the code calls as `await NAME.tool({...})`"),
        "rules": List(Map({
            "server": Str("a server name or glob; '*' when left out"),
            "tool": Str("a tool name or glob ('create_*'); '*' when left out"),
            "action": Str(enum=ACTIONS),
        }, required=("action",)), doc="per tool call: deny, ask (MCP elicitation) or allow; the first match wins"),
        "max_return_bytes": Size("output and return value that reach the model; the rest is cut (and said so)"),
        "flag_bytes_in": Size("an execution that took in at least this much ..."),
        "flag_bytes_out": Size("... and gave back at most this much is marked read-much-return-little"),
    }, doc="envgit mcp: the code-mode MCP server"),
}, doc="envgit policy, version 1", required=("version",))


def json_schema() -> dict:
    s = SCHEMA.json()
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["title"] = "envgit.yaml"
    return s


# --- validation over YAML nodes ----------------------------------------------------------

# Limits: what a policy may hold. The daemon reads the policy before a step can start, so a
# file far past any real policy (20 MB, 200,000 deny_read entries, a 5 MB shell pattern, a
# YAML alias bomb) is refused with its file:line instead of stalling every step.
MAX_BYTES = 512 * 1024          # the file (checked before it is parsed, in load.py)
MAX_ITEMS = 4096                # entries of one list or mapping
MAX_TEXT = 16384               # characters of one value (a path, glob, host, shell pattern, env value)
MAX_VALUES = 50_000             # values in the whole policy (aliases counted each time used)


BAD = object()      # a value that did not validate: left out of the data (its error is kept)


def validate(node, path, errors: list | None = None) -> tuple[dict, dict]:
    """(data, where): the plain data, and dotted key -> 'file:line' for every value. Every
    error is found, not only the first: with an `errors` list they are appended to it and the
    data holds what did validate (a bad map key left out, a bad list item as BAD, so the other
    items keep their index); without one the first is raised, saying how many more."""
    where: dict[str, str] = {}
    found: list[PolicyError] = [] if errors is None else errors
    try:
        data = _check(SCHEMA, node, "", path, where, found)
    except PolicyError as e:            # a limit: reading on is what it guards against
        found.append(e)
        data = BAD
    if data is BAD:
        data = {}
    if errors is None and found:
        raise several(found)
    return data, where


def _limits(node, key, path, where):
    import yaml
    if len(where) > MAX_VALUES:
        raise _err(path, node, f"the policy holds more than {MAX_VALUES} values (YAML aliases "
                   "count each time they are used); a policy this size is refused")
    label = key or "the policy"
    if isinstance(node, (yaml.SequenceNode, yaml.MappingNode)) and len(node.value) > MAX_ITEMS:
        extra = node.value[MAX_ITEMS]
        raise _err(path, extra[0] if isinstance(extra, tuple) else extra,
                   f"{label} has {len(node.value)} entries; at most {MAX_ITEMS} are read (use a glob "
                   "or a group such as 'browser-profiles' for many paths)")
    if isinstance(node, yaml.ScalarNode) and len(node.value) > MAX_TEXT:
        raise _err(path, node, f"{label} is {len(node.value)} characters long; at most {MAX_TEXT}")


def _err(path, node, msg):
    m = node.start_mark
    return PolicyError(path, m.line + 1, m.column + 1, msg)


def _kind(node):
    return type(node).__name__.replace("Node", "").lower()  # scalar / sequence / mapping


def _check(spec, node, key, path, where, errors):
    """The value of `node` as `spec` says, or BAD with its error appended to `errors`."""
    try:
        return _value(spec, node, key, path, where, errors)
    except _Bad as e:
        errors.append(e.error)
        return BAD


class _Bad(Exception):
    """A value's own error: recorded, and validation goes on with the next value."""

    def __init__(self, error):
        self.error = error


def _bad(path, node, msg):
    return _Bad(_err(path, node, msg))


def _value(spec, node, key, path, where, errors):
    import yaml  # the daemon and `policy` commands only; never on the hot path
    where[key] = f"{path}:{node.start_mark.line + 1}"
    _limits(node, key, path, where)
    label = key or "the policy"
    if isinstance(spec, (Map, Dict, OneOf)):
        if not isinstance(node, yaml.MappingNode):
            raise _bad(path, node, f"{label} must be a mapping (key: value), not a {_kind(node)}")
        pairs = []
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise _bad(path, k, f"keys in {label} must be plain words")
            pairs.append((k, v))
        seen = set()
        for k, _ in pairs:
            if k.value in seen:
                raise _bad(path, k, f"'{k.value}' appears twice in {label}; keep one")
            seen.add(k.value)
        if isinstance(spec, OneOf):
            found = [k.value for k, _ in pairs if k.value in spec.choices]
            if len(found) != 1:
                kinds = ", ".join(f"'{c}:'" for c in spec.choices)
                raise _bad(path, node, f"each entry of {label} needs exactly one of {kinds}")
            spec = spec.choices[found[0]]
        if isinstance(spec, Dict):
            out = {}
            for k, v in pairs:
                msg = spec.key.check(k.value) if spec.key.check else None
                if msg:
                    errors.append(_err(path, k, msg))
                    continue
                got = _check(spec.value, v, f"{key}.{k.value}", path, where, errors)
                if got is not BAD:
                    out[k.value] = got
            return out
        out = {}
        failed = False                  # a required value did not validate: neither does this
        for k, v in pairs:
            if k.value not in spec.fields:
                hint = difflib.get_close_matches(k.value, spec.fields, n=1)
                fix = f"did you mean '{hint[0]}'?" if hint else \
                    "known keys: " + ", ".join(spec.fields)
                errors.append(_err(path, k, f"unknown key '{k.value}' in {label}; {fix}"))
                continue
            got = _check(spec.fields[k.value], v, f"{key}.{k.value}".lstrip("."), path, where, errors)
            if got is not BAD:
                out[k.value] = got
            elif k.value in spec.required:
                failed = True
        missing = [r for r in spec.required if r not in out and r not in {k.value for k, _ in pairs}]
        if missing:
            raise _bad(path, node, f"{label} is missing '{missing[0]}'")
        return BAD if failed else out
    if isinstance(spec, List):
        if not isinstance(node, yaml.SequenceNode):
            raise _bad(path, node, f"{label} must be a list ([a, b] or '- a' lines), not a {_kind(node)}")
        return [_check(spec.item, v, f"{key}[{i}]", path, where, errors) for i, v in enumerate(node.value)]
    if not isinstance(node, yaml.ScalarNode):
        raise _bad(path, node, f"{label} must be a single value, not a {_kind(node)}")
    value = yaml.safe_load(yaml.serialize(node)) if node.tag != "tag:yaml.org,2002:str" else node.value
    if isinstance(spec, Int):
        if not isinstance(value, int) or isinstance(value, bool) or value < spec.minimum:
            raise _bad(path, node, f"{label} must be a whole number >= {spec.minimum}, not {node.value!r}")
        return value
    if isinstance(spec, Size):
        try:
            return parse_size(value)
        except ValueError as e:
            raise _bad(path, node, f"{label}: {e}") from None
    if isinstance(spec, Port):
        from .ports import PublishError, parse
        try:
            parse(value)
        except PublishError as e:
            raise _bad(path, node, f"{label}: {e}") from None
        return value
    if not isinstance(value, str):
        raise _bad(path, node, f"{label} must be text; quote it: \"{node.value}\"")
    if spec.enum and value not in spec.enum:
        hint = difflib.get_close_matches(value, spec.enum, n=1)
        fix = f"did you mean '{hint[0]}'?" if hint else "use one of: " + ", ".join(spec.enum)
        raise _bad(path, node, f"{label} is {value!r}; {fix}")
    if spec.check:
        msg = spec.check(value)
        if msg:
            raise _bad(path, node, f"{label}: {msg}")
    return value
