"""Adding entries to a policy file's `network.allow`, as the person would by hand: the rest of
the file (comments, order, quoting) is left as it is, and the result is loaded before it
replaces the file, so an edit that would not load is never written.

Used when the person accepts an offer (`envgit claude` naming the hosts Claude needs before it
starts). The shapes handled are the ones people write and `envgit init` writes: a flow list
(`allow: []`, `allow: [a, "b"]`), a block list (`allow:` then `- a` lines), no `allow` under
a block `network:`, no `network:`. Anything else (a flow-style `network: {…}`, anchors) raises
AllowEditError naming the line to add by hand.
"""

import json
import os

import yaml

from ..atomicfile import write_atomic
from ..policy import PolicyError, load_policy


class AllowEditError(Exception):
    """The file could not be edited safely; the text says what to add by hand."""


def add_allow(path: str, entries: list[str]) -> None:
    """Append `entries` (hosts or host:port) to network.allow in the file at `path`."""
    if not entries:
        return
    with open(path, encoding="utf-8") as f:
        text = f.read()
    by_hand = (f"add {', '.join(json.dumps(e) for e in entries)} to network.allow in {path}")
    try:
        new = _edited(text, entries)
    except (yaml.YAMLError, ValueError) as e:
        raise AllowEditError(f"{by_hand} ({e})") from None
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".envgit.yaml.edit-{os.getpid()}")
    try:
        write_atomic(tmp, new, sync=False)
        load_policy(tmp)
    except (OSError, PolicyError) as e:
        raise AllowEditError(f"{by_hand} (the edit would not load: {e})") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    write_atomic(path, new, chmod=os.stat(path).st_mode & 0o7777)


def _edited(text: str, entries: list[str]) -> str:
    quoted = [json.dumps(e) for e in entries]
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode) or root.flow_style:
        raise ValueError("the file is not a block mapping")
    network = _value(root, "network")
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    if network is None:
        tail = "" if text.endswith("\n") or not text else "\n"
        return text + tail + "network:\n  allow: [" + ", ".join(quoted) + "]\n"
    if not isinstance(network, yaml.MappingNode) or network.flow_style or not network.value:
        raise ValueError("network: is not a block mapping")
    allow = _value(network, "allow")
    if allow is None:
        indent = network.value[0][0].start_mark.column
        at = network.value[0][0].start_mark.line      # before network's first key
        lines.insert(at, " " * indent + "allow: [" + ", ".join(quoted) + "]\n")
        return "".join(lines)
    if not isinstance(allow, yaml.SequenceNode):
        raise ValueError("network.allow is not a list")
    if allow.flow_style:
        end = allow.end_mark.index - 1                  # the closing ]
        if text[end] != "]":
            raise ValueError("network.allow's list does not end with ]")
        sep = ", " if allow.value else ""
        return text[:end] + sep + ", ".join(quoted) + text[end:]
    last = allow.value[-1]
    indent = last.start_mark.column - 2                 # the column of its "- "
    if indent < 0 or not lines[last.start_mark.line][indent:].startswith("- "):
        raise ValueError("network.allow's items are not one `- item` per line")
    at = last.end_mark.line + (1 if last.end_mark.column > 0 else 0)
    lines[at:at] = [" " * indent + "- " + q + "\n" for q in quoted]
    return "".join(lines)


def _value(mapping, key):
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return v
    return None
