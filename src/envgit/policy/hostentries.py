"""What a policy makes the host read, run or connect to, outside every sandbox, for the
project: every credential (its `from:` — a variable, a file, an AWS profile or a command's
output — read by the daemon and sent to its `hosts:`), every MCP server (a stdio server's
command, arguments and environment, run by `envgit mcp`; a url server's URL, its `${VAR}`s
expanded from `envgit mcp`'s environment, connected to). A project's envgit.yaml comes with
the repository a person cloned, so each of its entries is used only once the person has
approved its exact text (hostcmd/trust.py, `envgit trust`); the organisation's are the
organisation's, and its policy may forbid a project's host *commands* altogether
(`project_host_commands: deny`).

Pure: what the policy data says, with the file and line each came from (load.py keeps the
list on the Policy, since the combined policy's provenance no longer holds per-entry lines).
"""

import hashlib
import json
import re
import shlex
from urllib.parse import urlsplit

from .schema import PolicyError

ORG_KEY = "project_host_commands"
VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
VERBS = {"env": "reads the variable", "file": "reads the file", "profile": "reads the AWS profile",
         "command": "runs"}


def _line(where_value: str) -> tuple[str, int]:
    f, _, n = where_value.rpartition(":")
    return f, int(n) if n.isdigit() else 0


def credential_approves(cred: dict) -> dict:
    """What approving a credential covers: its source (kind and text) and everywhere its value
    is sent (hosts, and methods/paths when they narrow it). A `command` credential without
    methods/paths hashes as before (approvals of version 1 stay valid)."""
    (kind, value), = cred["from"].items()
    out = {"kind": "credential", kind: value, "hosts": list(cred["hosts"])}
    for k in ("methods", "paths"):
        if cred.get(k):
            out[k] = list(cred[k])
    return out


def mcp_approves(spec: dict) -> dict:
    """What approving an MCP server covers: a url server's URL (with its `${VAR}`s as
    written), a stdio server's command, arguments and environment."""
    if spec.get("url"):
        return {"kind": "mcp", "url": spec["url"]}
    return {"kind": "mcp", "command": spec["command"], "args": list(spec.get("args") or []),
            "env": dict(sorted((spec.get("env") or {}).items()))}


def named(data: dict, where: dict, org: bool) -> list[dict]:
    """Every entry of one policy file's data the host acts on, as
    {kind, name, key, where, org, command, text, verb, sent_to, variables, approves, digest}:
    `text` is what `envgit trust` shows after `verb` (runs, reads the variable, reads the file,
    reads the AWS profile, connects to), `sent_to` where the value
    goes, `approves` everything the approval covers, `digest` its hash (the approval's key);
    `command` says whether it runs a program on the host."""
    out = []
    for name, cred in (data.get("credentials") or {}).items():
        (kind, value), = cred["from"].items()
        key = f"credentials.{name}.from.{kind}"
        approves = credential_approves(cred)
        sent = list(cred["hosts"])
        if cred.get("methods"):
            sent.append("methods " + " ".join(cred["methods"]))
        if cred.get("paths"):
            sent.append("paths " + " ".join(cred["paths"]))
        out.append(_entry("credential", name, key, where.get(key, ""), org, value, approves,
                          command=kind == "command", sent_to=sent,
                          verb=VERBS.get(kind, "reads " + kind)))
    for name, spec in ((data.get("mcp") or {}).get("servers") or {}).items():
        approves = mcp_approves(spec)
        if spec.get("url"):
            key = f"mcp.servers.{name}.url"
            u = urlsplit(VAR.sub("", spec["url"]))
            out.append(_entry("mcp", name, key, where.get(key, ""), org, spec["url"], approves,
                              command=False, sent_to=[u.netloc or spec["url"]],
                              verb="connects to"))
        elif spec.get("command"):
            key = f"mcp.servers.{name}.command"
            text = shlex.join([spec["command"], *approves["args"]])
            if approves["env"]:
                text = " ".join(f"{k}={shlex.quote(v)}" for k, v in approves["env"].items()) + " " + text
            out.append(_entry("mcp", name, key, where.get(key, ""), org, text, approves,
                              command=True, sent_to=[], verb="runs"))
    if isinstance(data.get("signing"), dict) and data["signing"].get("key"):
        sig = data["signing"]
        approves = signing_approves(sig)
        out.append(_entry("signing", "key", "signing.key", where.get("signing.key", where.get("signing", "")),
                          org, sig["key"], approves, command=False, sent_to=[],
                          verb="signs the commits and tags steps make with"))
    return out


def signing_approves(sig: dict) -> dict:
    """What approving a signing key covers: the key, and whether each signature is asked."""
    return {"kind": "signing", "key": sig["key"], "action": sig.get("action") or "allow"}


def _entry(kind, name, key, where_value, org, text, approves, command, sent_to, verb) -> dict:
    blob = json.dumps(approves, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogateescape")
    variables = sorted(set(VAR.findall(json.dumps(approves, ensure_ascii=False)))) \
        if kind == "mcp" else []
    return {"kind": kind, "name": name, "key": key, "where": where_value, "org": org,
            "command": command, "text": text, "verb": verb, "sent_to": sent_to,
            "variables": variables, "approves": approves,
            "digest": hashlib.sha256(blob).hexdigest()}


def label(entry: dict) -> str:
    """'credential gh' / 'mcp server corpus'."""
    if entry["kind"] == "signing":
        return "signing key"
    return ("credential " if entry["kind"] == "credential" else "mcp server ") + entry["name"]


def describe(entry: dict) -> str:
    """One line: what the host does with it, e.g. 'reads the variable GH_TOKEN and sends it to
    api.github.com:443'."""
    out = f"{entry['verb']} `{entry['text']}`"
    if entry["variables"]:
        out += " with " + ", ".join(f"${{{v}}}" for v in entry["variables"]) + \
            " from your environment"
    if entry["kind"] == "credential":
        out += " and sends " + ("its output" if entry["command"] else "it") + \
            " to " + ", ".join(entry["sent_to"])
    return out


def refuse_in_project(where: dict, path) -> None:
    """The key is the organisation's: a project that set it would only seem to forbid
    something (or, read as allowing, be a project loosening its organisation)."""
    if ORG_KEY in where:
        f, n = _line(where[ORG_KEY])
        raise PolicyError(f or path, n, 1, f"{ORG_KEY} is read from the organisation policy "
                          "only; remove it from this file")


def check_org_ban(odata: dict, owhere: dict, project_entries: list[dict]) -> None:
    """`project_host_commands: deny` in the organisation policy: a project naming a host
    command is refused at load, at the project's line, naming the organisation's key."""
    cmds = [e for e in project_entries if e["command"]]
    if odata.get(ORG_KEY) != "deny" or not cmds:
        return
    e = cmds[0]
    f, n = _line(e["where"])
    raise PolicyError(f, n, 1, f"{e['key']} runs a command on the host, which the organisation "
                      f"policy forbids for projects ({owhere.get(ORG_KEY, ORG_KEY)}: {ORG_KEY}: "
                      "deny); remove it (a credential can be read with `from: env`, `file` or "
                      "`profile`; an MCP server reached by `url`)")
