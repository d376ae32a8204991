"""The host commands a policy names: programs envgit itself starts on the host, outside every
sandbox (a credential's `from: command`, an MCP stdio server's command, arguments and
environment). A project's envgit.yaml comes with the repository a person cloned, so each of
its host commands runs only once the person has approved its exact text (hostcmd/trust.py,
`envgit trust`); the organisation's are the organisation's, and its policy may forbid a
project's altogether (`project_host_commands: deny`).

Pure: what the policy data says, with the file and line each came from (load.py keeps the
list on the Policy, since the combined policy's provenance no longer holds per-entry lines).
"""

import hashlib
import json
import shlex

from .schema import PolicyError

ORG_KEY = "project_host_commands"


def _line(where_value: str) -> tuple[str, int]:
    f, _, n = where_value.rpartition(":")
    return f, int(n) if n.isdigit() else 0


def named(data: dict, where: dict, org: bool) -> list[dict]:
    """Every host command of one policy file's data, as
    {kind, name, key, where, org, text, approves, digest}: `text` is what `envgit trust`
    shows, `approves` everything the approval covers (what runs, and for a credential the
    hosts its output is sent to), `digest` its hash (the approval's key)."""
    out = []
    for name, cred in (data.get("credentials") or {}).items():
        if "command" in cred["from"]:
            key = f"credentials.{name}.from.command"
            approves = {"kind": "credential", "command": cred["from"]["command"],
                        "hosts": list(cred["hosts"])}
            out.append(_entry("credential", name, key, where.get(key, ""), org,
                              cred["from"]["command"], approves))
    for name, spec in ((data.get("mcp") or {}).get("servers") or {}).items():
        if spec.get("command"):
            key = f"mcp.servers.{name}.command"
            approves = {"kind": "mcp", "command": spec["command"], "args": list(spec.get("args") or []),
                        "env": dict(sorted((spec.get("env") or {}).items()))}
            text = shlex.join([spec["command"], *approves["args"]])
            if approves["env"]:
                text = " ".join(f"{k}={shlex.quote(v)}" for k, v in approves["env"].items()) + " " + text
            out.append(_entry("mcp", name, key, where.get(key, ""), org, text, approves))
    return out


def _entry(kind, name, key, where_value, org, text, approves) -> dict:
    blob = json.dumps(approves, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogateescape")
    return {"kind": kind, "name": name, "key": key, "where": where_value, "org": org,
            "text": text, "approves": approves, "digest": hashlib.sha256(blob).hexdigest()}


def label(entry: dict) -> str:
    """'credential gh' / 'mcp server corpus'."""
    return ("credential " if entry["kind"] == "credential" else "mcp server ") + entry["name"]


def refuse_in_project(where: dict, path) -> None:
    """The key is the organisation's: a project that set it would only seem to forbid
    something (or, read as allowing, be a project loosening its organisation)."""
    if ORG_KEY in where:
        f, n = _line(where[ORG_KEY])
        raise PolicyError(f or path, n, 1, f"{ORG_KEY} is read from the organisation policy "
                          "only; remove it from this file")


def check_org_ban(odata: dict, owhere: dict, project_cmds: list[dict]) -> None:
    """`project_host_commands: deny` in the organisation policy: a project naming a host
    command is refused at load, at the project's line, naming the organisation's key."""
    if odata.get(ORG_KEY) != "deny" or not project_cmds:
        return
    e = project_cmds[0]
    f, n = _line(e["where"])
    raise PolicyError(f, n, 1, f"{e['key']} runs a command on the host, which the organisation "
                      f"policy forbids for projects ({owhere.get(ORG_KEY, ORG_KEY)}: {ORG_KEY}: "
                      "deny); remove it (a credential can be read with `from: env`, `file` or "
                      "`profile`; an MCP server reached by `url`)")
