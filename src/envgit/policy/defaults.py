"""What every policy starts from. A project's envgit.yaml extends these lists; a default read
deny is lifted only by naming the path in `filesystem.allow_read`."""

# Credentials and private data, closed unless the policy re-allows the exact path.
DENY_READ = [
    "~/.ssh", "~/.aws", "~/.gnupg", "~/.config/gh", "~/.config/gcloud", "~/.azure", "~/.kube",
    "~/.docker", "~/.netrc", "~/.npmrc", "~/.pypirc", "~/.cargo/credentials",
    "~/.cargo/credentials.toml", "~/.git-credentials", "~/.password-store",
    "~/.config/git/credentials", "~/.local/share/keyrings",
    "browser-profiles", "shell-history",
    "/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers",
    "/etc/ssh/ssh_host_*_key", "/etc/security/opasswd",
    "**/.env", "**/.env.*",
]

# Named groups usable in deny_read.
GROUPS = {
    "browser-profiles": [
        "~/.mozilla", "~/.config/google-chrome", "~/.config/google-chrome-beta",
        "~/.config/chromium", "~/.config/BraveSoftware", "~/.config/microsoft-edge",
        "~/.config/microsoft-edge-beta", "~/.var/app/org.mozilla.firefox",
        "~/.var/app/com.google.Chrome", "~/.var/app/org.chromium.Chromium",
        "~/.var/app/com.brave.Browser", "~/.var/app/com.microsoft.Edge",
        "~/snap/firefox", "~/snap/chromium", "~/snap/brave",
    ],
    "shell-history": [
        "~/.bash_history", "~/.zsh_history", "~/.zhistory", "~/.histfile", "~/.sh_history",
        "~/.local/share/fish/fish_history", "~/.python_history", "~/.node_repl_history",
        "~/.psql_history", "~/.mysql_history", "~/.sqlite_history", "~/.lesshst",
        "~/.viminfo", "~/.local/state/nvim/shada",
    ],
}

# The home directory inside the sandbox is empty but for these (read-only, when they exist):
# the toolchains a command may need, never their credentials (those stay denied above).
# Also the template files a default `**/.env.*` deny would otherwise catch.
ALLOW_READ = [
    "~/.pyenv", "~/.local/bin", "~/.local/lib", "~/.cargo/bin", "~/.cargo/env", "~/.rustup",
    "~/.nvm", "~/.volta", "~/.bun/bin", "~/.deno/bin", "~/go/bin", "~/.sdkman", "~/.asdf",
    "~/.gitconfig", "~/.config/git/config", "~/.config/git/ignore", "~/.config/git/attributes",
    "**/.env.example", "**/.env.sample", "**/.env.template", "**/.env.dist",
]

ALLOW_WRITE = ["."]

# Writable tree, read-only paths: places from which a write inside runs code outside later
# (git hooks and config; direnv; agents' project settings, hooks and MCP servers; editor tasks).
# One that does not exist yet cannot be covered without creating it: a step that creates one
# is marked `escape-route-written` instead, naming the path.
PROTECT = [".git/hooks", ".git/config", ".git/info/attributes", ".envrc", ".claude/settings.json",
           ".claude/settings.local.json", ".claude/hooks", ".claude/commands", ".claude/agents",
           ".mcp.json", ".github/hooks", ".codex", ".vscode/tasks.json"]

ENV_PASS = ["PATH", "HOME", "LANG", "LANGUAGE", "LC_*", "TERM", "COLORTERM", "NO_COLOR",
            "TZ", "USER", "LOGNAME", "SHELL", "PYENV_ROOT", "PYENV_VERSION"]

# A variable whose name looks like this reaches the sandbox only when passed by its exact name.
SECRET_NAME_GLOBS = ["*_TOKEN", "*_TOKEN_*", "*TOKEN", "*_SECRET", "*_SECRET_*", "*SECRET",
                     "*_KEY", "*_KEY_*", "*PASSWORD*", "*PASSWD*", "*_CREDENTIALS*", "*_AUTH",
                     "*_PAT", "*APIKEY*", "*API_KEY*", "*_COOKIE*", "*SESSION*"]

MAX_FILE_SIZE = 256 * 1024**2

ASK_TIMEOUT_S = 120

IRREVERSIBLE = [{"preset": "default"}]

# Written by `envgit init`: the same defaults, spelled out and explained.
TEMPLATE = """\
# envgit policy: what a step may read, write and reach. Checked by `envgit policy check`;
# `envgit policy show` prints the effective policy with where each value came from.
version: 1

filesystem:
  # Added to the built-in denies (~/.ssh, ~/.aws, ~/.gnupg, cloud and registry credentials,
  # browser profiles, shell histories, /etc/shadow, **/.env and **/.env.*). A denied path
  # fails inside the sandbox like an unreadable file.
  deny_read: []
  # Lifts a deny or shows an extra host path read-only, e.g. "~/.aws/config".
  allow_read: []
  # The project ('.') and a private per-session /tmp are writable; everything else is not.
  allow_write: ["."]
  # Read-only inside the writable project, added to .git/hooks, .git/config, the
  # core.hooksPath directory and envgit.yaml itself.
  protect: []

env:
  # Passed into the sandbox besides PATH, HOME, LANG, LC_*, TERM, TZ, USER, SHELL.
  # A token-like name (*_TOKEN, *_SECRET, *_KEY, *PASSWORD*) passes only if named exactly.
  pass: []

network:
  # Hosts reachable through envgit's proxy: 'host', 'host:port' or '*.domain'.
  allow: []
  # Request-level rules per host (TLS is terminated for these hosts), e.g.
  #   api.github.com: { methods: [GET] }
  l7: {}

irreversible:
  # git push, npm publish, PyPI upload, cargo publish, image pushes, GitHub/GitLab writes.
  - preset: default
  # Your own, e.g.:
  # - net: { host: "api.github.com", method: POST, path: "/repos/*/*/issues" }
  #   action: ask

# A courtesy: an early, readable refusal of matching command lines. `g=git; $g push`
# does not match; the network rule above is what stops the push.
shell:
  - deny: ["git push"]

snapshot:
  max_file_size: 256MiB
  exclude: []
"""
