"""Which upstream tool calls the code may make: `mcp.rules` of the policy, a pure decision."""

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class ToolDecision:
    action: str            # deny | ask | allow
    rule: str              # "mcp.rules[i]", or "default" when no rule matched


def decide_tool(rules: list[dict], server: str, tool: str) -> ToolDecision:
    """The first rule whose server and tool globs match; a call no rule names is allowed
    (the code can only reach the servers the policy lists)."""
    for i, rule in enumerate(rules):
        if fnmatchcase(server, rule.get("server", "*")) and fnmatchcase(tool, rule.get("tool", "*")):
            return ToolDecision(rule["action"], f"mcp.rules[{i}]")
    return ToolDecision("allow", "default")
