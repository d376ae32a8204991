"""Small edits to a policy file's text that keep everything else of it byte for byte: its
comments, order, quoting, flow or block style and indentation (`envgit policy suggest`). The
text is read with PyYAML's composer only to find where things are (each node's start and end
in the text); the edit is a splice of new text at that place, never a re-emitted document.

Two edits: append items to a list (`network.allow`, an l7 entry's `methods`), and add an entry
to a mapping (`network.l7`), each creating the mappings on the way when they are missing. Pure:
text in, text out."""

import json

import yaml


class EditError(ValueError):
    """The file's shape at that place is not one these edits know (a scalar where a list or
    mapping belongs, an alias, a tag)."""


def scalar(value) -> str:
    """A value as YAML text: a string double-quoted (JSON's escapes are YAML's), a list or a
    mapping in flow style."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k}: {scalar(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(scalar(v) if not _plain(v) else v for v in value) + "]"
    return json.dumps(value)


def _plain(v) -> bool:
    # HTTP methods read better bare (`methods: [GET]`, as docs/POLICY.md writes them), but only
    # a word YAML reads back as the same string: NULL is null, ON and YES are true
    if not (isinstance(v, str) and v.isascii() and v.isalpha() and v.isupper()):
        return False
    try:
        return yaml.safe_load(v) == v
    except yaml.YAMLError:
        return False


def _compose(text: str):
    node = yaml.compose(text)
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode):
        raise EditError("the file is not a mapping")
    return node


def _child(node, key: str):
    """(key node, value node) of `key` in mapping `node`, or None."""
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


def _is_null(node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null") and node.value in ("", "~", "null")


def _line_end(text: str, index: int) -> int:
    """Where the line holding the character before `index` ends (after its newline)."""
    if index > 0 and text[index - 1] == "\n":
        return index
    nl = text.find("\n", index)
    return len(text) if nl < 0 else nl + 1


def _end(node) -> int:
    """The index just past the last character a node's own text holds (a block collection's
    end mark lies at the next token, past the comments after it: its last leaf is exact)."""
    while isinstance(node, yaml.MappingNode | yaml.SequenceNode) and not node.flow_style and node.value:
        last = node.value[-1]
        node = last[1] if isinstance(last, tuple) else last
    return node.end_mark.index


def _nested(keys, leaf: str, indent: int) -> str:
    """`keys[0]:` … `keys[-1]: LEAF` as block lines at `indent`."""
    pad = " " * indent
    if len(keys) == 1:
        return f"{pad}{keys[0]}: {leaf}\n"
    return f"{pad}{keys[0]}:\n" + _nested(keys[1:], leaf, indent + 2)


def _flow_nested(keys, leaf: str) -> str:
    out = leaf
    for k in reversed(keys[1:]):
        out = f"{{{k}: {out}}}"
    return f"{keys[0]}: {out}"


def _splice(text, at, new, cut=0):
    return text[:at] + new + text[at + cut:]


def _ensure_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def _under(text: str, key_node, lines: str) -> str:
    """`lines` inserted on the lines right after `key_node`'s line."""
    at = _line_end(text, key_node.end_mark.index + 1)
    text = _ensure_newline(text[:at]) + text[at:]
    at = at if text[at - 1:at] == "\n" else at + 1
    return _splice(text, at, lines)


def _add(text: str, key_node, node, keys, leaf: str) -> str:
    """Add `keys[0]: … keys[-1]: leaf` to the mapping `node`, the value of `key_node` (None:
    the file's top; `node` None: an empty file; a null `node`: `key:` with nothing under it)."""
    if node is None:
        return _ensure_newline(text) + _nested(keys, leaf, 0)
    if isinstance(node, yaml.MappingNode) and node.value and node.flow_style:
        return _splice(text, _end(node.value[-1][1]), f", {_flow_nested(keys, leaf)}")
    if isinstance(node, yaml.MappingNode) and node.value:
        at = _line_end(text, _end(node))
        text = _ensure_newline(text[:at]) + text[at:]
        at = at if text[at - 1:at] == "\n" else at + 1
        return _splice(text, at, _nested(keys, leaf, node.value[0][0].start_mark.column))
    if key_node is None:            # the whole file is `{}`
        close = node.end_mark.index - 1
        return _splice(text, close, _flow_nested(keys, leaf))
    # `key: {}`, `key: ~` or `key:`: the value's text goes, the entries go on lines under it
    if node.start_mark.index < node.end_mark.index:
        start = node.start_mark.index
        while start > 0 and text[start - 1] == " ":
            start -= 1
        text = _splice(text, start, "", node.end_mark.index - start)
    return _under(text, key_node, _nested(keys, leaf, key_node.start_mark.column + 2))


def _walk(text: str, path):
    """(key node, node, keys missing): with every key of `path` there, the node at `path`
    and its key; otherwise the deepest mapping there (or a null value, or None for an empty
    file) with its key, and the keys under it still missing."""
    node, key_node = _compose(text), None
    for i, key in enumerate(path):
        if node is None or _is_null(node):
            return key_node, node, list(path[i:])
        if not isinstance(node, yaml.MappingNode):
            raise EditError(f"{'.'.join(path[:i]) or 'the file'} is not a mapping")
        found = _child(node, key)
        if found is None:
            return key_node, node, list(path[i:])
        key_node, node = found
    return key_node, node, []


def append(text: str, path, items) -> str:
    """The text with `items` (values) added at the end of the list at `path` (a tuple of
    keys), the list and the mappings above it created when missing."""
    rendered = [scalar(v) for v in items]
    if not rendered:
        return text
    key_node, node, missing = _walk(text, path)
    flow = "[" + ", ".join(rendered) + "]"
    if missing:
        return _add(text, key_node, node, missing, flow)
    if _is_null(node):              # `allow:` with nothing: it gets the list
        colon = text.index(":", key_node.end_mark.index)
        end = node.end_mark.index if node.start_mark.index < node.end_mark.index else colon + 1
        return _splice(text, colon, ": " + flow, end - colon)
    if not isinstance(node, yaml.SequenceNode):
        raise EditError(f"{'.'.join(path)} is not a list")
    if node.flow_style:
        if node.value:
            return _splice(text, _end(node.value[-1]), "".join(f", {r}" for r in rendered))
        return _splice(text, node.end_mark.index - 1, ", ".join(rendered))
    at = _line_end(text, _end(node))
    text = _ensure_newline(text[:at]) + text[at:]
    at = at if text[at - 1:at] == "\n" else at + 1
    return _splice(text, at, "".join(f"{' ' * node.start_mark.column}- {r}\n" for r in rendered))


def add_entry(text: str, path, key: str, value) -> str:
    """The text with `key: value` (value in flow style) added to the mapping at `path`, the
    mappings on the way created when missing."""
    key_node, node, missing = _walk(text, path)
    entry = [*missing, json.dumps(key)]
    if not missing and not (_is_null(node) or isinstance(node, yaml.MappingNode)):
        raise EditError(f"{'.'.join(path)} is not a mapping")
    if not missing and isinstance(node, yaml.MappingNode) and _child(node, key) is not None:
        raise EditError(f"{'.'.join(path)} already has {key}")
    return _add(text, key_node, node, entry, scalar(value))


def line_of(text: str, path, item=None) -> int:
    """The line (from 1) of the value at `path`, of the list item equal to `item`, or of the
    mapping key `item`; 0 when not there."""
    node = _compose(text)
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return 0
        found = _child(node, key)
        if found is None:
            return 0
        node = found[1]
    if item is None:
        return node.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode):
        for v in node.value:
            if isinstance(v, yaml.ScalarNode) and v.value == item:
                return v.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        found = _child(node, item)
        if found is not None:
            return found[0].start_mark.line + 1
    return 0
