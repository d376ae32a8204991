"""`envgit policy presets`: the network presets (`preset:NAME` in network.allow) and the rules
of the irreversible preset, each with what it matches, as data and as text. Pure: read from
the one list of each (defaults.NETWORK_PRESETS, netpresets.PRESET_RULES)."""

from .defaults import NETWORK_PRESETS, PRESET_PREFIX
from .netpresets import DOWNLOAD_HOSTS, PRESET, PRESET_RULES


def _words(value) -> list[str] | None:
    """A rule's methods ("POST PUT", "*") as a list; None when the rule does not say."""
    if value is None:
        return None
    return value.split() if isinstance(value, str) else list(value)


def presets_json() -> dict:
    """{network: [...], irreversible: [...], download_hosts: [...]}: every key in every entry
    (null where a rule does not narrow by it)."""
    network = [{"name": PRESET_PREFIX + name, "hosts": list(hosts), "for": why}
               for name, (hosts, why) in NETWORK_PRESETS.items()]
    rules = []
    for d in PRESET_RULES:
        header = d.get("header")
        rules.append({
            "name": d["name"], "cited_as": f"preset:{PRESET}/{d['name']}", "kind": d["kind"],
            "hosts": list(d["hosts"]) if d.get("hosts") is not None else None,
            "methods": _words(d.get("methods")), "not_methods": _words(d.get("not_methods")),
            "paths": list(d["paths"]) if "paths" in d else None,
            "not_paths": list(d["not_paths"]) if "not_paths" in d else None,
            "header": {"name": header[0], "values": list(header[1])} if header else None,
            "body": d.get("body"),
        })
    return {"network": network, "irreversible": rules, "download_hosts": list(DOWNLOAD_HOSTS)}


def render_presets(width: int = 96) -> str:
    """The text `envgit policy presets` prints."""
    from .defaults import render_network_presets
    j = presets_json()
    lines = ["# network presets: 'preset:NAME' in network.allow stands for these hosts",
             *render_network_presets("  ", width=width), "",
             f"# irreversible rules of preset {PRESET} ('- preset: {PRESET}' in irreversible; "
             "'- rule: NAME' with 'action:' changes one)"]
    name_w = max(len(r["name"]) for r in j["irreversible"])
    pad = " " * (name_w + 4)
    for r in j["irreversible"]:
        lines.append(f"  {r['name']:<{name_w}}  {r['kind']}")
        hosts = ", ".join(r["hosts"]) if r["hosts"] else "any (but the download hosts below)"
        lines.append(f"{pad}hosts: {hosts}")
        methods = " ".join(r["methods"] or ["*"])
        if r["not_methods"]:
            methods += f" (when a method of the request is not {' '.join(r['not_methods'])})"
        lines.append(f"{pad}methods: {methods}")
        if r["paths"] is not None:
            lines.append(f"{pad}paths: {' '.join(r['paths'])}")
        if r["not_paths"]:
            lines.append(f"{pad}not paths: {' '.join(r['not_paths'])}")
        if r["header"]:
            lines.append(f"{pad}header: {r['header']['name']}: {' | '.join(r['header']['values'])}")
        if r["body"]:
            lines.append(f"{pad}body: {r['body']}")
    lines += ["", "# download hosts (no irreversible action known there: tunnelled untouched, and "
              "the any-host rules above skip them)"]
    line = " "
    for h in j["download_hosts"]:
        if len(line) + len(h) + 1 > width:
            lines.append(line.rstrip())
            line = " "
        line += " " + h
    lines.append(line.rstrip())
    return "\n".join(lines) + "\n"
