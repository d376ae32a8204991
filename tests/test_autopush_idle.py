"""The daemon's auto-push (remote/auto.py) starts nothing after a step when no remote is set
--auto: it looks again only when the remotes directory changes. The positive case, a push
after a step, is tests/test_remote.py::test_auto_push_after_a_step."""

from envgit.remote import layout
from envgit.remote.auto import AutoPush


def test_no_thread_is_started_after_a_step_with_no_remote_set_auto(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    push = AutoPush(str(tmp_path))
    push.step_ended()
    assert push.thread is None                  # no remotes directory at all
    layout.write_private(layout._conf_path("ci"), b'{"name": "ci"}\n')    # one, not --auto
    push.step_ended()
    assert push.thread is None
    seen = push._seen
    push.step_ended()
    assert push._seen == seen and push.thread is None     # nothing changed: not read again
