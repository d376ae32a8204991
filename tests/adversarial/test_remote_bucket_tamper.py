"""Red team 16: someone who can write the bucket but holds no key (every pushing machine's
credentials can: the bucket is shared) hides steps from the auditor or leaves damage that the
person's next push never repairs. Real S3 server (`rclone serve s3`, tests/s3server.py), real
CLI. Oracles: `fsck --remote`'s exit status and problems, the steps `audit`/`log --remote` show.

These need no step (the attacker is on the bucket), so they are not parametrized over the
harness's root/user; they run as the test's user like tests/test_remote.py."""

import json

from test_remote import _fsck, add_remote, fill, machine


def _auditor(tmp_path, s3, m1, name="aud"):
    a = machine(tmp_path, name, s3, init=False)
    (tmp_path / f"key-{name}").write_bytes((m1.home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(a, s3, key_file=tmp_path / f"key-{name}")
    return a


def _audit_steps(a):
    r = a.envgit("audit", "--remote", "ci", "--json")
    return r.returncode, json.loads(r.stdout)


def test_a_machine_deleted_from_the_bucket_is_named_to_an_auditor_who_saw_it(tmp_path, s3):
    """The auditor has read m1 (its head version is in <remote>.seen.json). Rolling m1's head
    back is named ("rolled back"); deleting every object of m1 (the strongest rollback: to
    nothing) must be named too, not give a clean fsck and an audit without m1's steps."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    m2 = machine(tmp_path, "m2", s3, project="other")
    (tmp_path / "k2").write_bytes((m1.home / ".config/envgit/remotes/ci.key").read_bytes())
    add_remote(m2, s3, key_file=tmp_path / "k2")
    m2.run("echo x > x.txt", check=True)
    m2.envgit("push", "ci", check=True)
    aud = _auditor(tmp_path, s3, m1)
    code, got = _audit_steps(aud)
    assert code == 0 and {s["machine"] for s in got["steps"]} == {"m1", "m2"}, got
    assert _fsck(aud) == (0, [])
    # the attacker deletes every object under projects/proj/m1/
    for name in list(s3.objects()):
        if name.startswith("projects/proj/m1/"):
            s3.delete(name)
    code, problems = _fsck(aud)
    code2, got = _audit_steps(aud)
    assert code == 1 and any("m1" in p for p in problems), (
        "every step of proj/m1 vanished from the bucket, yet the auditor that had read it gets a "
        f"clean fsck (exit {code}, problems {problems}) and an audit of m2 only (exit {code2}, "
        f"machines {sorted({s['machine'] for s in got['steps']})})")


def test_a_head_rolled_back_one_push_is_named_to_an_auditor_who_saw_it(tmp_path, s3):
    """The auditor read head version 2. The attacker puts version 1 back (kept from before)
    and deletes the segment past it: `fsck` must say the head went back (seen.json knows 2)."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    old = s3.get("projects/proj/m1/head")
    segs1 = {n for n in s3.objects() if "/journal/" in n}
    m1.run("echo hidden > hidden.txt", check=True)
    m1.envgit("push", "ci", check=True)
    aud = _auditor(tmp_path, s3, m1)
    assert _fsck(aud) == (0, [])
    n_before = len(_audit_steps(aud)[1]["steps"])
    s3.put("projects/proj/m1/head", old)
    for n in {n for n in s3.objects() if "/journal/" in n} - segs1:
        s3.delete(n)
    code, problems = _fsck(aud)
    n_after = len(_audit_steps(aud)[1]["steps"])
    assert code == 1 and any("rolled back" in p for p in problems), (
        f"audit went from {n_before} to {n_after} steps; fsck: exit {code}, {problems}")


def test_a_fresh_auditor_is_told_of_a_head_rolled_back_one_push(tmp_path, s3):
    """No deletion at all: the attacker only puts the previous head back. The segment the last
    push wrote is still there, past the head; a reader that never saw the newer head takes it
    for an interrupted push and shows one step fewer with a clean fsck."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    old = s3.get("projects/proj/m1/head")
    m1.run("echo hidden > hidden.txt", check=True)
    m1.envgit("push", "ci", check=True)
    s3.put("projects/proj/m1/head", old)
    aud = _auditor(tmp_path, s3, m1)
    code, problems = _fsck(aud)
    steps = [s["id"] for s in _audit_steps(aud)[1]["steps"]]
    assert code == 1 and problems, (
        f"the head of the push before was put back: the auditor sees steps {steps} (step 3, "
        f"'echo hidden', is gone) and fsck says exit {code}, {problems}")


def test_the_next_push_repairs_a_damaged_pack(tmp_path, s3):
    """A pack's bytes flipped on the bucket: fsck names it; the person pushes again (a new
    step): the push trusts the listing (the name is there) and never re-uploads it, so the
    bucket stays broken though the machine holds the good pack."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    packs = sorted(n for n in s3.objects() if "/packs/" in n)
    data = bytearray(s3.get(packs[0]))
    data[len(data) // 2] ^= 1
    s3.put(packs[0], bytes(data))
    assert _fsck(m1)[0] == 1
    m1.run("echo more > more.txt", check=True)
    m1.envgit("push", "ci", check=True)
    code, problems = _fsck(m1)
    assert code == 0, f"after a new push the damaged pack is still there: {problems}"


def test_the_next_push_repairs_a_deleted_segment(tmp_path, s3):
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    seg = next(n for n in s3.objects() if "/journal/" in n)
    s3.delete(seg)
    m1.run("echo more > more.txt", check=True)
    r = m1.envgit("push", "ci")
    code, problems = _fsck(m1)
    assert code == 0, f"push exit {r.returncode} {r.stderr.strip()}; after it fsck: {problems}"


def test_a_stray_machine_prefix_does_not_stop_restore_of_the_only_real_machine(tmp_path, s3):
    """An object under projects/proj/zz/ (any bytes): `restore --from ci last` in project proj
    on another machine picked proj/m1 before; now it refuses ("holds 2 of them")."""
    m1 = machine(tmp_path, "m1", s3)
    fill(m1)
    add_remote(m1, s3)
    m1.envgit("push", "ci", check=True)
    aud = _auditor(tmp_path, s3, m1)
    r = aud.envgit("log", "--remote", "ci", "--json")
    assert r.returncode == 0, r.stderr
    s3.put("projects/proj/zz/head", b"junk")
    r = aud.envgit("log", "--remote", "ci", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
