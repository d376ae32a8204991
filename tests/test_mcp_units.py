"""The pure parts of envgit mcp: JSON Schema to TypeScript, tool rules, the policy section."""

import pytest

from envgit.mcp.rules import decide_tool
from envgit.mcp.typescript import binding, declarations, ts_type
from envgit.policy import PolicyError, load_policy


@pytest.mark.parametrize("schema, ts", [
    ({"type": "string"}, "string"),
    ({"type": "integer"}, "number"),
    ({"type": ["string", "null"]}, "string | null"),
    ({"enum": ["open", "closed"]}, '"open" | "closed"'),
    ({"const": 3}, "3"),
    ({"type": "array", "items": {"type": "boolean"}}, "boolean[]"),
    ({"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "number"}]}}, "(string | number)[]"),
    ({"type": "array", "items": [{"type": "string"}, {"type": "number"}]}, "[string, number]"),
    ({"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                {"type": "object", "properties": {"b": {"type": "number"}}}]},
     "{\n  a: string;\n} & {\n  b?: number;\n}"),
    ({"type": "object", "additionalProperties": {"type": "number"}}, "{\n  [key: string]: number;\n}"),
    ({"type": "object", "properties": {}}, "{}"),
    ({"type": "object"}, "{\n  [key: string]: unknown;\n}"),
    ({}, "unknown"),
])
def test_schema_to_typescript(schema, ts):
    assert ts_type(schema) == ts


def test_object_properties_docs_refs_and_odd_names():
    schema = {"type": "object", "required": ["id"], "$defs": {
        "Label": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
        "properties": {
            "id": {"type": "integer", "description": "the issue number"},
            "labels": {"type": "array", "items": {"$ref": "#/$defs/Label"}},
            "x-odd": {"type": "string"}}}
    assert ts_type(schema) == (
        "{\n  /** the issue number */\n  id: number;\n  labels?: {\n    name: string;\n  }[];\n"
        '  "x-odd"?: string;\n}')


def test_a_cyclic_ref_ends_in_unknown():
    schema = {"$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}},
              "$ref": "#/$defs/Node"}
    assert "unknown" in ts_type(schema)


def test_declarations_group_tools_per_server_with_doc_comments():
    text = declarations({"github": [
        {"name": "list-issues", "description": "List issues.\nNewest first.",
         "inputSchema": {"type": "object", "properties": {"repo": {"type": "string"}}, "required": ["repo"]}},
        {"name": "get_me", "inputSchema": {"type": "object", "properties": {}},
         "outputSchema": {"type": "object", "properties": {"login": {"type": "string"}}, "required": ["login"]}},
    ]})
    assert text == (
        "declare namespace github {\n"
        "  /**\n   * List issues.\n   * Newest first.\n   */\n"
        "  function list_issues(args: {\n    repo: string;\n  }): Promise<string>;\n"
        "  function get_me(args: {}): Promise<{\n    login: string;\n  }>;\n"
        "}")
    assert binding("list-issues") == "list_issues" and binding("2fa") == "_2fa"


def test_tool_rules_first_match_wins_and_default_allows():
    rules = [{"server": "github", "tool": "create_*", "action": "ask"},
             {"tool": "delete_*", "action": "deny"},
             {"server": "github", "action": "allow"}]
    assert decide_tool(rules, "github", "create_issue").action == "ask"
    assert decide_tool(rules, "github", "create_issue").rule == "mcp.rules[0]"
    assert decide_tool(rules, "files", "delete_file").action == "deny"
    assert decide_tool(rules, "github", "delete_repo").rule == "mcp.rules[1]"
    assert decide_tool(rules, "files", "read_file") == decide_tool([], "files", "read_file")
    assert decide_tool([], "files", "read_file").rule == "default"


def test_the_policy_mcp_section(tmp_path):
    p = tmp_path / "envgit.yaml"
    p.write_text("version: 1\n")
    assert load_policy(p).mcp == {"servers": {}, "rules": [], "max_return_bytes": 20480,
                                  "flag_bytes_in": 102400, "flag_bytes_out": 1024}
    p.write_text("version: 1\nmcp:\n  servers:\n    gh: {command: gh-mcp, args: [stdio], env: {T: '${GH}'}}\n"
                 "    remote: {url: 'http://127.0.0.1:9/mcp'}\n"
                 "  rules: [{tool: 'create_*', action: ask}]\n  max_return_bytes: 4KiB\n")
    m = load_policy(p).mcp
    assert m["servers"]["gh"] == {"command": "gh-mcp", "args": ["stdio"], "env": {"T": "${GH}"}}
    assert m["rules"] == [{"tool": "create_*", "action": "ask"}]
    assert m["max_return_bytes"] == 4096 and m["flag_bytes_in"] == 102400
    for bad, msg in [("  servers:\n    my-server: {command: x}\n", "is not a name the code can call"),
                     ("  rules: [{tool: x}]\n", "is missing 'action'"),
                     ("  max_return_bytes: lots\n", "is not a size"),
                     ("  server: {}\n", "did you mean 'servers'?")]:
        p.write_text("version: 1\nmcp:\n" + bad)
        with pytest.raises(PolicyError, match=msg):
            load_policy(p)
