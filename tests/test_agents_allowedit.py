"""Adding hosts to network.allow (agents/allowedit.py), as the person would by hand: every
other line of the file kept, each shape people write handled, and an edit that would not load
never written."""

import pytest

from envgit.agents.allowedit import AllowEditError, add_allow
from envgit.policy import load_policy
from envgit.policy.defaults import TEMPLATE


def edit(tmp_path, text, entries):
    p = tmp_path / "envgit.yaml"
    p.write_text(text)
    add_allow(str(p), entries)
    return p.read_text(), load_policy(str(p)).network_allow


def test_the_init_templates_empty_flow_list_gets_the_hosts(tmp_path):
    from envgit.policy.defaults import render_network_presets
    text = TEMPLATE.replace("@PRESETS@", "\n".join(render_network_presets("  # ")))
    new, allow = edit(tmp_path, text, ["api.anthropic.com", "model.test:8443"])
    assert '  allow: ["api.anthropic.com", "model.test:8443"]\n' in new
    assert new.replace('"api.anthropic.com", "model.test:8443"', "") == text    # nothing else moved
    assert "api.anthropic.com" in allow and "model.test:8443" in allow


def test_a_flow_list_with_entries_and_a_block_list_keep_theirs(tmp_path):
    new, allow = edit(tmp_path, "version: 1\nnetwork:\n  allow: [preset:pypi, 'x.test']  # mine\n",
                      ["a.test"])
    assert new == "version: 1\nnetwork:\n  allow: [preset:pypi, 'x.test', \"a.test\"]  # mine\n"
    new, allow = edit(tmp_path, "version: 1\nnetwork:\n  allow:\n    - x.test   # why\n    - y.test\n"
                      "  l7: {}\n", ["a.test"])
    assert new == "version: 1\nnetwork:\n  allow:\n    - x.test   # why\n    - y.test\n    - \"a.test\"\n  l7: {}\n"
    assert allow[-1] == "a.test"


def test_no_allow_or_no_network_section_is_added(tmp_path):
    new, allow = edit(tmp_path, "version: 1\nnetwork:\n  l7: {}\n", ["a.test"])
    assert new == "version: 1\nnetwork:\n  allow: [\"a.test\"]\n  l7: {}\n" and "a.test" in allow
    new, allow = edit(tmp_path, "version: 1", ["a.test"])
    assert new == "version: 1\nnetwork:\n  allow: [\"a.test\"]\n" and "a.test" in allow


def test_a_shape_it_cannot_edit_is_refused_with_the_line_to_add_and_the_file_kept(tmp_path):
    p = tmp_path / "envgit.yaml"
    for text in ("version: 1\nnetwork: {allow: []}\n", "version: 1\nnetwork:\n  allow: 3\n"):
        p.write_text(text)
        with pytest.raises(AllowEditError, match='add "a.test" to network.allow'):
            add_allow(str(p), ["a.test"])
        assert p.read_text() == text
    assert sorted(x.name for x in tmp_path.iterdir()) == ["envgit.yaml"]     # no temporary left
