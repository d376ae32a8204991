"""Red team 16, faults: a reader (`fsck --remote`, `log --remote`, `audit`, `restore --from`)
that runs while a machine pushes. MachineView lists the machine's objects, then reads the head:
a push that lands between the two (its segment and head written after the listing) makes the
reader see a head whose entries are "missing from the bucket": a clean bucket reported as
damaged, and `restore --from` refused. Made deterministic by running the real push (in this
process, against the real S3 server) right after the reader's listing: exactly what m1's
auto-push does at that moment while an auditor reads on another machine."""

from test_remote import add_remote, machine


def test_a_push_between_a_readers_listing_and_head_is_not_reported_as_damage(tmp_path, s3, monkeypatch):
    from envgit.journal import Journal
    from envgit.paths import Project
    from envgit.remote import layout
    from envgit.remote.push import open_remote, push
    from envgit.remote.read import MachineView
    from envgit.remote.s3 import Bucket
    m1 = machine(tmp_path, "m1", s3)
    add_remote(m1, s3)
    for k, v in {**m1.env, "XDG_CONFIG_HOME": str(m1.home / ".config")}.items():
        monkeypatch.setenv(k, v)
    project = Project(str(m1.root))
    remote = layout.load("ci")
    j = Journal(project.journal)

    def one_step(n):
        step = j.begin_step({"argv": ["echo", str(n)], "cwd": str(m1.root), "session": "s1", "marks": []})
        j.append(step, "end", {"exit_code": 0, "signal": None, "marks": []})
    one_step(0)
    push(project, remote)
    one_step(1)                                  # the next step, pushed while the reader reads

    real_listing = Bucket.listing
    pushed = []

    def listing_then_push(self, under):
        out = real_listing(self, under)
        if under.startswith("projects/") and not pushed:
            pushed.append("pushing")                # the push's own listing is not this hook
            monkeypatch.setattr(Bucket, "listing", real_listing)
            pushed.append(push(project, remote))    # m1's auto-push lands now
        return out
    monkeypatch.setattr(Bucket, "listing", listing_then_push)
    bucket, sealer = open_remote(remote)
    view = MachineView(bucket, sealer, "proj", "m1", "ci")
    monkeypatch.setattr(Bucket, "listing", real_listing)
    j.close()
    assert pushed
    after = MachineView(bucket, sealer, "proj", "m1", "ci")
    assert after.problems == []                  # the bucket is fine
    assert view.problems == [], f"a reader during a push reports a clean bucket as damaged: {view.problems}"
