"""What a step's end says about it (policy/marks.py `after_step`), in process: the marks each
finding earns and the notices its terminal is shown, in the checks' order; and the retention rule
gc applies (daemon/gcop.py `retained`). The end-to-end tests (test_core_isolation, test_routes_*,
test_vm) drive the same code through real steps."""

from types import SimpleNamespace

from envgit.daemon.gcop import retained
from envgit.policy.marks import Found, after_step, mentioned, policy_files_written


def test_a_quiet_step_has_no_marks_and_says_nothing():
    assert after_step(Found(step=3, summary={"tree": "t"})) == ([], [])


def test_marks_come_in_the_checks_order_and_the_clients_are_not_repeated():
    found = Found(step=7, summary={"error": "snapshot failed: disk full"}, denied=["/p/.env"],
                  requests=[{"decision": "deny"}, {"decision": "ask", "irreversible": True}],
                  client_marks=["agent-edit", "denied-net", 5],
                  escapes=[".git/hooks/pre-commit", ".envrc"], taken_back=[".git/hooks/pre-commit"],
                  policy_files=["sub/envgit.yaml"], stripped=["bin/tool"])
    marks, notices = after_step(found)
    assert marks == ["denied-read", "denied-net", "asked", "irreversible", "snapshot-failed",
                     "agent-edit", "escape-route-written", "policy-file-written", "setuid-stripped"]
    assert notices[0].startswith("took back what it wrote to escape routes") and ".git/hooks/pre-commit" in notices[0]
    assert notices[1].startswith("WROTE AN ESCAPE ROUTE") and ".envrc" in notices[1] and "envgit rewind 7" in notices[1]
    assert notices[2].startswith("snapshot failed: disk full; the step is recorded without a snapshot")
    assert notices[3].startswith("policy-file-written:") and "sub/envgit.yaml" in notices[3]
    assert notices[4].endswith("bin/tool")


def test_an_unreached_host_marks_denied_net_once():
    marks, notices = after_step(Found(step=1, summary={}, unreached=["add pypi.org to network.allow"]))
    assert marks == ["denied-net"] and notices == ["add pypi.org to network.allow"]
    marks, _ = after_step(Found(step=1, summary={}, requests=[{"answer": "deny"}], unreached=["x"]))
    assert marks == ["denied-net"]


def test_the_vms_write_back_is_said_and_marks_nothing():
    found = Found(step=2, summary={}, vm_after={"refused": ["a"], "kept": ["b"], "edited": ["c"], "error": "E"},
                  memory={"error": "M"})
    marks, notices = after_step(found)
    assert marks == []
    assert [n.split(":")[0] for n in notices[:3]] == [
        "the VM's step changed paths the policy does not let a step write; they were not copied to the project",
        "the VM's step removed directories that, on the host, still hold what the guest never had (denied or "
        "protected files, a repository's .git); they were left",
        "changed on the host while the VM's step ran"]
    assert notices[3:] == ["E", "M"]


def test_a_command_line_names_a_denied_path_in_any_of_its_forms():
    masked = ["/p/.env", "/home/u/.ssh/id_rsa", "/p/secrets/key"]
    assert mentioned(["cat", ".env"], masked, "/p", "/home/u") == ["/p/.env"]
    assert mentioned(["cat", "~/.ssh/id_rsa"], masked, "/p", "/home/u") == ["/home/u/.ssh/id_rsa"]
    assert mentioned(["ls"], masked, "/p", "/home/u") == []


def test_only_nested_policy_files_count():
    summary = {"paths": [{"path": "envgit.yaml"}, {"path": "a/envgit.yaml"}, {"path": "b/.envgit/x"},
                         {"path": "c/envgit.yaml.bak"}]}
    assert policy_files_written(summary) == ["a/envgit.yaml", "b/.envgit/x"]


def test_gc_keeps_every_snapshot_without_a_rule_and_the_newest_always():
    steps = [SimpleNamespace(id=i, started_ns=i * 10**9) for i in range(1, 6)]
    assert retained(steps, None, None, 0) == {1, 2, 3, 4, 5}
    assert retained(steps, 2, None, 0) == {4, 5}
    assert retained(steps, None, 1.5, 5 * 10**9) == {4, 5}      # begun within 1.5 s of now
    assert retained(steps, None, 0.001, 100 * 10**9) == {5}     # the newest, whatever its age
    assert retained([], 1, None, 0) == set()


def test_the_daemon_refuses_a_request_field_of_the_wrong_type_in_one_line():
    """protocol.REQUESTS: a frame is anyone's bytes; a field of the wrong type is refused before
    any handler reads it (in process, with a session that has nothing to do)."""
    import asyncio

    from envgit.daemon import protocol

    async def nothing():
        return None
    sess = SimpleNamespace(unrecorded=[], orphans_pending=False, load_policy_off_loop=nothing)
    for msg, field in (({"op": "begin", "argv": "rm -rf /", "cwd": "/p"}, "`argv` must be a list of text"),
                       ({"op": "begin", "argv": ["ls"], "env": {"A": 1}}, "`env` must be an object of text"),
                       ({"op": "rewind", "step": 1, "apply": "yes"}, "`apply` must be true or false"),
                       ({"op": "sandbox", "step": 1, "pidns": "4026531836"}, "`pidns` must be a whole number"),
                       ({"op": "begin", "argv": ["ls"], "publish": [True]}, "`publish` must be a list of ports")):
        reply = asyncio.run(protocol.dispatch(sess, msg))
        assert reply["exit"] == 2 and field in reply["error"] and "\n" not in reply["error"], reply
    assert protocol.wrong_field("begin", {"argv": ["ls"], "cwd": "/p", "env": {"A": "1"}, "pid": None,
                                          "publish": [5173, "8000:8080"]}) is None
