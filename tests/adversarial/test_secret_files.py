"""Class 7: secrets a step could read. Each holds the canary; the oracle is the canary in what
the step printed. The legitimate use beside each (git still configured, npm's registry still
set, a public certificate still readable, a harmless variable still passed) is checked too."""

import pytest

from conftest import CANARY

GITCONFIG = f"""[user]
\tname = Person
\temail = person@example.com
[url "https://{CANARY}@github.com/"]
\tinsteadOf = https://github.com/
[http]
\textraHeader = AUTHORIZATION: basic {CANARY}
[credential]
\thelper = store --file /secret/{CANARY}
[core]
\tfsmonitor = touch /tmp/{CANARY}
[alias]
\tst = status
\tleak = !echo {CANARY}
"""

XDG = f"""[http "https://gitlab.example/"]
\textraheader = PRIVATE-TOKEN: {CANARY}
[sendemail]
\tsmtppass = {CANARY}
[github]
\ttoken = {CANARY}
"""


def _person_home(a):
    from pathlib import Path
    home = Path(a.host("echo $HOME").stdout.strip())
    if not home.exists():
        home.mkdir(parents=True)
        a.own(home)
    return home


PERSONS_SECRETS = ("the secrets are the person's own files, hidden by the step's view: DAC does not keep them from a "
                   "non-root person's step, whose view bwrap builds in a user namespace (and whose HOME is runuser's "
                   "passwd home)")


@pytest.mark.both_uids(PERSONS_SECRETS)
def test_git_global_config_is_passed_sanitised(attacker):
    a = attacker
    home = _person_home(a)
    made = [home / ".gitconfig", home / ".config" / "git" / "config"]
    made[0].write_text(GITCONFIG)
    made[1].parent.mkdir(parents=True, exist_ok=True)
    made[1].write_text(XDG)
    a.own(home)
    try:
        for policy in ("version: 1\n", 'version: 1\nfilesystem:\n  allow_read: ["~"]\n'):
            a.write_policy(policy)
            r = a.run("cat ~/.gitconfig ~/.config/git/config /etc/gitconfig 2>&1; git config --list "
                      "--show-origin; git leak 2>&1; echo; git config user.email; git st >/dev/null && echo ST-OK")
            assert CANARY not in r.stdout + r.stderr, r.stdout
            assert "person@example.com" in r.stdout and "ST-OK" in r.stdout, r.stdout + r.stderr
    finally:
        for f in made:
            f.unlink()


@pytest.mark.both_uids(PERSONS_SECRETS)
def test_repository_config_credentials_are_not_shown(attacker):
    """What CI checkouts leave in .git/config: an extraheader and a token in the remote URL."""
    a = attacker
    r = a.host(f"git config http.https://github.com/.extraheader 'AUTHORIZATION: basic {CANARY}' && "
               f"git remote add origin https://x-access-token:{CANARY}@github.com/o/r.git")
    assert r.returncode == 0, r.stderr
    r = a.run("cat .git/config; git config --list; git remote -v")
    assert CANARY not in r.stdout + r.stderr, r.stdout
    assert "https://github.com/o/r.git" in r.stdout, r.stdout


PROJECT_SECRETS = {
    ".pypirc": f"[pypi]\npassword = {CANARY}\n",
    ".netrc": f"machine example.com password {CANARY}\n",
    "deploy/.git-credentials": f"https://u:{CANARY}@github.com\n",
    ".docker/config.json": f'{{"auths": {{"r": {{"auth": "{CANARY}"}}}}}}\n',
    ".dev.vars": f"API_KEY={CANARY}\n",
    "keys/id_rsa": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{CANARY}\n",
    "fixtures/home/id_ed25519": f"{CANARY}\n",
    "deploy/prod.env": f"DB_PASSWORD={CANARY}\n",
    ".envrc": f"export AWS_SECRET_ACCESS_KEY={CANARY}\n",
    "certs/server.pem": f"-----BEGIN PRIVATE KEY-----\n{CANARY}\n-----END PRIVATE KEY-----\n",
    "certs/tls.key": f"-----BEGIN RSA PRIVATE KEY-----\n{CANARY}\n",
    "certs/client.p12": f"{CANARY}\n",
    ".git/git-crypt/keys/default": f"{CANARY}\n",
    "infra/.aws/credentials": f"aws_secret_access_key={CANARY}\n",
}


@pytest.mark.both_uids(PERSONS_SECRETS)
def test_credential_files_in_the_project_are_denied(attacker):
    a = attacker
    for rel, text in PROJECT_SECRETS.items():
        p = a.root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    (a.root / ".npmrc").write_text(f"registry=https://registry.example/\n"
                                   f"//registry.example/:_authToken={CANARY}\n"
                                   "//other.example/:_authToken=${NPM_TOKEN}\n")
    (a.root / "certs" / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIPUBLIC\n")
    a.own(a.root)
    script = "; ".join(f"cat '{rel}' 2>/dev/null" for rel in [*PROJECT_SECRETS, ".npmrc", "certs/ca.pem"])
    r = a.run(script + "; grep -r . . 2>/dev/null | grep -v '^./.git/objects/'")
    assert CANARY not in r.stdout, r.stdout
    assert "registry=https://registry.example/" in r.stdout          # npm still finds its registry
    assert "${NPM_TOKEN}" in r.stdout                                 # a reference is no secret
    assert "MIIPUBLIC" in r.stdout                                    # a certificate stays readable


def test_secret_values_do_not_pass_a_prefix_glob(attacker):
    a = attacker
    a.write_policy("version: 1\nenv:\n  pass: [\"APP_*\", \"MYSQL_*\"]\n")
    env = {"MYSQL_PWD": CANARY, "APP_DATABASE_URL": f"postgres://u:{CANARY}@db/x",
           "APP_WEBHOOK_URL": f"https://hooks.example/{CANARY}", "APP_UPSTREAM": f"ghp_{CANARY}xx",
           "APP_DSN": f"https://{CANARY}@sentry.example/1", "APP_MODE": "dev-mode"}
    r = a.envgit("run", "--", "env", env=env)
    assert r.returncode == 0, r.stderr
    assert CANARY not in r.stdout, r.stdout
    assert "APP_MODE=dev-mode" in r.stdout


@pytest.mark.both_uids(PERSONS_SECRETS)
def test_a_tracked_denied_file_is_said(attacker):
    """The limit: a committed .env is in git's objects, which a step needs. It is said."""
    a = attacker
    r = a.host(f"echo 'SECRET={CANARY}' > .env && git add -f .env && "
               "git -c user.name=a -c user.email=a@example.com commit -q -m env")
    assert r.returncode == 0, r.stderr
    out = a.envgit("policy", "check", check=True).stdout
    assert "tracked by git" in out and ".env" in out, out
    r = a.run("cat .env")
    assert CANARY not in r.stdout and "tracked by git" in r.stderr, r.stderr
