"""The policy: envgit.yaml's schema, loading with line-numbered errors, and pure decisions.

Importing this package is cheap (no YAML): the parser is imported only by load_policy."""

from ..paths import POLICY_FILE
from .decide import (
    CommandDecision,
    PathDecision,
    Rules,
    decide_command,
    decide_path,
    decide_resolved,
    is_denied,
    resolve,
)
from .load import Policy, load_policy, render
from .schema import PolicyError, json_schema

__all__ = ["CommandDecision", "Decision", "PathDecision", "Request", "Policy", "PolicyError", "POLICY_FILE", "Rules",
           "decide_command", "decide_path", "decide_request", "decide_resolved", "is_denied", "json_schema",
           "judge_connect", "load_policy", "needs_interception", "render", "resolve"]

_NETWORK = ("Decision", "Request", "decide_request", "judge_connect", "needs_interception")


def __getattr__(name):
    # The network decisions are for the daemon's proxy: kept off the import of the hot path.
    if name in _NETWORK:
        from . import network
        return getattr(network, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
