"""The policy: envgit.yaml's schema, loading with line-numbered errors, and pure decisions.

Importing this package is cheap (no YAML): the parser is imported only by load_policy."""

from .decide import (CommandDecision, PathDecision, Rules, decide_command, decide_path,
                     decide_resolved, is_denied, resolve)
from .load import POLICY_FILE, Policy, load_policy, render
from .network import Decision, Request, decide_request, judge_connect, needs_interception
from .schema import PolicyError, json_schema

__all__ = ["CommandDecision", "Decision", "PathDecision", "Request", "Policy", "PolicyError", "POLICY_FILE", "Rules",
           "decide_command", "decide_path", "decide_request", "decide_resolved", "is_denied", "json_schema", "judge_connect",
           "load_policy", "needs_interception", "render", "resolve"]
