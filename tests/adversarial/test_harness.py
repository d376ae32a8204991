"""The harness itself: both attackers really are who they claim, and a step really runs."""

import pytest


@pytest.mark.both_uids("it checks each attacker is who it claims: the unprivileged one must really be another uid, "
                       "owning what its step writes")
def test_attacker_identity(attacker):
    r = attacker.run("id -u; echo made > marker")
    assert r.returncode == 0, r.stderr
    assert (attacker.root / "marker").read_text() == "made\n"
    owner = (attacker.root / "marker").stat().st_uid
    if attacker.user:
        assert owner != 0
    else:
        assert attacker.is_root
