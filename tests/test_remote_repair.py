"""`envgit push` repairs what it can see changed on the bucket since this machine pushed (its
ETag record); `push --repair` fetches and opens every object of the machine and uploads again
what is damaged, even damage the record never saw (the record lost, or made after the damage).
Real S3 server (`rclone serve s3`), real CLI; the oracle is `fsck --remote`."""

import json

from kit.s3 import s3_server  # noqa: F401  (the fixture `s3`)
from test_remote import _fsck, add_remote, fill, machine


def test_push_repair_uploads_again_a_pack_damaged_before_the_record(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    pack = sorted(n for n in s3.objects() if "/packs/" in n)[0]
    data = bytearray(s3.get(pack))
    data[len(data) // 2] ^= 1
    s3.put(pack, bytes(data))
    (m1.root / ".envgit" / "remote-ci.etags.json").unlink()     # the record lost
    m1.envgit("push", "ci", check=True)          # nothing new, nothing known to be changed
    code, problems = _fsck(m1)
    assert code == 1 and any(pack in p for p in problems), problems
    r = json.loads(m1.envgit("push", "ci", "--repair", "--json", check=True).stdout)
    assert r["packs"] == 1, r
    assert _fsck(m1) == (0, [])


def test_a_head_mark_past_the_head_is_read_again_not_taken_for_a_rollback(tmp_path, s3):
    """The mark of the newest head is the only one left after a push; pushing again twice
    keeps fsck clean for a reader that never saw the heads (no stale mark reads as a rollback)."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    for n in range(3):
        m1.run(f"echo {n} > f{n}.txt", check=True)
        m1.envgit("push", "ci", check=True)
    marks = sorted(n for n in s3.objects() if "/heads/" in n)
    assert marks == ["projects/proj/m1/heads/000000000003"], marks
    m2 = machine(tmp_path, "m2", s3, init=False)
    (tmp_path / "k").write_bytes((m1.home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(m2, s3, key_file=tmp_path / "k")
    assert _fsck(m2) == (0, [])
