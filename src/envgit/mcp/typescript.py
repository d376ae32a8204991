"""TypeScript declarations of the upstream tools, from their JSON Schemas: what the model reads
in `execute`'s description to write calls like `await corpus.search({query: "x"})`."""

import json
import re

IDENT = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
MAX_DEPTH = 8          # deeper (or cyclic $ref) schemas are typed `unknown`


def binding(name: str) -> str:
    """The JS name of a tool: its own name when it is an identifier, else with _ for the rest."""
    b = re.sub(r"[^A-Za-z0-9_$]", "_", name)
    return b if IDENT.match(b) else "_" + b


def ts_type(schema, defs=None, depth=0, indent="") -> str:
    """The TypeScript type of a JSON Schema (the subset tools use: types, enum/const,
    properties, items, anyOf/oneOf/allOf, $ref into $defs, additionalProperties)."""
    if schema is True or schema == {} or schema is None:
        return "unknown"
    if schema is False:
        return "never"
    if depth > MAX_DEPTH:
        return "unknown"
    defs = defs if defs is not None else {**schema.get("definitions", {}), **schema.get("$defs", {})}
    sub = lambda s: ts_type(s, defs, depth + 1, indent)   # noqa: E731
    if "$ref" in schema:
        target = defs.get(schema["$ref"].rsplit("/", 1)[-1])
        return sub(target) if target is not None else "unknown"
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"]) or "never"
    for key, sep in (("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")):
        if key in schema:
            return sep.join(_paren(sub(s)) for s in schema[key])
    t = schema.get("type")
    if isinstance(t, list):
        return " | ".join(_paren(sub({**schema, "type": one})) for one in t)
    if t in ("string",):
        return "string"
    if t in ("number", "integer"):
        return "number"
    if t == "boolean":
        return "boolean"
    if t == "null":
        return "null"
    if t == "array" or "items" in schema:
        items = schema.get("items")
        if isinstance(items, list):                 # a tuple
            return "[" + ", ".join(sub(s) for s in items) + "]"
        return _paren(sub(items)) + "[]"
    if t == "object" or "properties" in schema:
        return _object(schema, defs, depth, indent)
    return "unknown"


def _object(schema, defs, depth, indent) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    extra = schema.get("additionalProperties")
    inner = indent + "  "
    lines = []
    for name, prop in props.items():
        doc = _doc(prop.get("description") if isinstance(prop, dict) else None, inner)
        key = name if IDENT.match(name) else json.dumps(name)
        opt = "" if name in required else "?"
        lines.append(f"{doc}{inner}{key}{opt}: {ts_type(prop, defs, depth + 1, inner)};")
    if extra is True or isinstance(extra, dict) or (extra is None and "properties" not in schema):
        value = ts_type(extra, defs, depth + 1, inner) if isinstance(extra, dict) else "unknown"
        lines.append(f"{inner}[key: string]: {value};")
    if not lines:
        return "{}"
    return "{\n" + "\n".join(lines) + "\n" + indent + "}"


def _paren(t: str) -> str:
    return f"({t})" if (" | " in t or " & " in t) and not t.startswith("{") else t


def _doc(text, indent) -> str:
    if not text:
        return ""
    body = text.strip().replace("*/", "*\\/").splitlines()
    if len(body) == 1:
        return f"{indent}/** {body[0]} */\n"
    return f"{indent}/**\n" + "".join(f"{indent} * {line}".rstrip() + "\n" for line in body) + f"{indent} */\n"


def declarations(servers: dict[str, list[dict]]) -> str:
    """`declare namespace SERVER { function TOOL(args: …): Promise<…>; }` for every server, each
    tool's description as its doc comment. A tool's result is its structured content when it
    declares an output schema, else the text of its content."""
    out: list[str | None] = []        # None: a tool without a description (left out at the end)
    for server, tools in servers.items():
        out.append(f"declare namespace {server} {{")
        for tool in tools:
            args = ts_type(tool.get("inputSchema") or {"type": "object"}, indent="  ")
            result = ts_type(tool["outputSchema"], indent="  ") if tool.get("outputSchema") else "string"
            out.append(_doc(tool.get("description"), "  ").rstrip("\n") or None)
            out.append(f"  function {binding(tool['name'])}(args: {args}): Promise<{result}>;")
        out.append("}")
    return "\n".join(line for line in out if line is not None)
