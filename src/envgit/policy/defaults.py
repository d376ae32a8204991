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
    # The same credentials wherever they appear in the project (a copied home, a fixture, a
    # deploy directory): an agent reads project files freely, so a name alone decides.
    "**/*.env", "**/.envrc", "**/.netrc", "**/_netrc", "**/.pypirc", "**/.git-credentials",
    "**/.docker/config.json", "**/.dev.vars", "**/.dev.vars.*", "**/.aws/credentials",
    "**/id_rsa", "**/id_dsa", "**/id_ecdsa", "**/id_ed25519", "**/id_ecdsa_sk", "**/id_ed25519_sk",
    "**/*.p12", "**/*.pfx", "**/.git/git-crypt",
]

# Files denied by what they hold rather than by name: `*.pem` and `*.key` are often public
# certificates (a venv's CA bundle), so only those holding a private key are masked.
DENY_READ_IF_CONTAINS = {"**/*.pem": b"PRIVATE KEY-----", "**/*.key": b"PRIVATE KEY-----"}

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
    "~/.config/git/ignore", "~/.config/git/attributes",
    "**/.env.example", "**/.env.sample", "**/.env.template", "**/.env.dist",
    "**/example.env", "**/sample.env", "**/template.env",
]
# Git's own configuration (system, ~/.gitconfig, ~/.config/git/config and what they include)
# is not shown as it is: the sandbox gets a sanitised copy as its global config, without
# credentials or the keys that run host programs (sandbox/gitconfig.py).

ALLOW_WRITE = ["."]

# Escape routes: files in the writable project that a program outside the sandbox obeys later
# (git, direnv, npm, editors, agents, dev containers), so that a write inside runs code outside
# or routes the person's credentials. ONE list, printed by `envgit policy protected`:
#   protect  read-only inside a step; one that does not exist yet cannot be covered without
#            creating it, so a step that creates it is marked `escape-route-written` and told
#            at the end of the step, naming the path
#   mark     writable (tools write them legitimately), but any change is marked and told
#   quiet    writable, and what package managers write there on every install (a virtualenv's
#            programs and .pth files, node_modules/.bin): a change is listed on the step, mark
#            `tool-files-written` and one plain line, never the loud notice (a person who is told
#            of every `pip install` stops reading what is told)
# A pattern without '**' names a path at the project root; '**/x' names x at any depth;
# '<venv>/x' names x in every virtualenv (a directory holding pyvenv.cfg) at any depth.
# The line drawn: a route is a file a program obeys WITHOUT the person choosing to run the
# project's code: git, their shell (direnv, an activated venv), a package manager's install,
# an editor or agent opening the folder, CI once pushed; or one that routes their credentials.
# A Makefile, package.json scripts, justfile or test files are not: the person runs them by
# choosing to run the project (make, npm test), and a step may change any project code; that
# is what its diff is for. node_modules/.bin is rewritten by every npm/yarn/pnpm install and
# only links to code under node_modules/<pkg>, as a venv's bin/ is pip's: both are listed
# quietly (`quiet`), so that what a step put on the person's PATH is on record without a loud
# notice for every install.
# Beyond these, sandbox/gitroutes.py adds what git itself reads in every repository found in
# the project (nested ones, submodules, worktrees, a `.git` file's target, `commondir`), the
# core.hooksPath directory named by any config source, and the files configs include.
ESCAPE_ROUTES = [
    # git, in the project's repository and in every one nested in it ('**/' is also the root)
    ("**/.git/hooks", "protect", "git runs them on commit, checkout, merge, push"),
    ("**/.git/config", "protect", "core.fsmonitor, core.hooksPath, aliases, filters run programs"),
    ("**/.git/config.worktree", "protect", "git's per-worktree config"),
    ("**/.git/commondir", "protect", "sends git to another directory's config and hooks"),
    ("**/.git/info/attributes", "protect", "selects the filter and diff programs git runs"),
    ("**/.git/branches", "protect", "legacy remotes: where git fetches and pushes"),
    ("**/.git/remotes", "protect", "legacy remotes: where git fetches and pushes"),
    ("**/.git/worktrees/*/commondir", "protect", "a worktree's common dir"),
    ("**/.git/worktrees/*/config.worktree", "protect", "a worktree's config"),
    ("**/.git/worktrees/*/config", "protect", "a worktree's gitdir without a commondir is its own "
                                              "repository: git obeys its config (git never writes one)"),
    ("**/.git/worktrees/*/hooks", "protect", "the same: its hooks"),
    ("**/.git/worktrees/*/info/attributes", "protect", "the same: its filter and diff drivers"),
    ("**/.git/modules/**/config", "protect", "a submodule's git config"),
    ("**/.git/modules/**/config.worktree", "protect", "a submodule's git config"),
    ("**/.git/modules/**/hooks", "protect", "a submodule's git hooks"),
    ("**/.git/modules/**/commondir", "protect", "a submodule's redirect"),
    ("**/.git/modules/**/info/attributes", "protect", "a submodule's filter and diff drivers"),
    ("**/.git", "git", "a .git file (worktree, submodule) sends git to its gitdir: the file "
                       "is read-only, and that gitdir's config and hooks are protected"),
    ("**/.gitmodules", "protect", "submodule URLs and paths git clones and updates"),
    # State git leaves between commands. Writable (a rebase or cherry-pick inside a step writes
    # them) but one left behind at the step's end is marked, in every repository's gitdir:
    ("**/.git/rebase-merge", "mark", "a rebase in progress: the person's `git rebase "
                                     "--continue` runs its todo list's `exec` lines"),
    ("**/.git/rebase-apply", "mark", "an am/rebase in progress: `--continue` applies its patches"),
    ("**/.git/sequencer", "mark", "a cherry-pick/revert in progress: `--continue` picks its todo"),
    ("**/.git/objects/info/alternates", "mark", "other object stores git reads, even outside"),
    ("**/.git/info/grafts", "mark", "rewrites commits' parents: changes the history git shows"),
    ("**/.git/shallow", "mark", "cuts history off at the commits it lists"),
    ("**/.git/refs/replace", "mark", "replacement objects git shows instead of the real ones"),
    ("**/.git/packed-refs", "mark", "only when it holds refs/replace/: the same, packed"),
    ("**/.git/info/exclude", "mark", "hides untracked files from the person's git status, "
                                     "unseen (a .gitignore change shows in the diff)"),
    ("**/.gitattributes", "mark", "names filter, diff and merge drivers the person's own "
                                  "git config defines (git runs them)"),
    (".envrc", "protect", "direnv runs it on cd"),
    (".husky", "protect", "husky's hooks directory delegates to the scripts here"),
    (".claude/settings.json", "protect", "Claude Code hooks and permissions"),
    (".claude/settings.local.json", "protect", "Claude Code hooks and permissions"),
    (".claude/hooks", "protect", "Claude Code hooks"),
    (".claude/commands", "protect", "Claude Code commands"),
    (".claude/agents", "protect", "Claude Code agents"),
    (".mcp.json", "protect", "MCP servers an agent starts"),
    (".github/hooks", "protect", "Copilot agent hooks"),
    (".codex", "protect", "Codex config, hooks and MCP servers"),
    (".vscode/tasks.json", "protect", "VS Code tasks (may run on folder open)"),
    (".vscode/mcp.json", "protect", "MCP servers VS Code starts"),
    (".cursor/mcp.json", "protect", "MCP servers Cursor starts"),
    (".cursor/hooks.json", "protect", "Cursor hooks"),
    (".gemini/settings.json", "protect", "Gemini CLI MCP servers and tools"),
    (".zed/settings.json", "protect", "Zed language servers, tasks and MCP servers"),
    ("opencode.json", "protect", "opencode MCP servers and commands"),
    (".devcontainer", "protect", "initializeCommand runs on the host"),
    (".devcontainer.json", "protect", "initializeCommand runs on the host"),
    ("**/.npmrc", "protect", "registry and ${NPM_TOKEN} routing, node-options, script-shell"),
    ("**/.yarnrc", "protect", "registry and token routing"),
    ("**/.yarnrc.yml", "protect", "yarnPath runs code, npmRegistryServer routes the token"),
    (".yarn/releases", "protect", "the yarn release yarnPath names: runs on every yarn command"),
    (".yarn/plugins", "protect", "yarn loads them on every yarn command"),
    ("**/.pnpmfile.cjs", "protect", "pnpm runs its hooks on every install"),
    ("**/.pnpmfile.mjs", "protect", "pnpm runs its hooks on every install"),
    ("pnpm-workspace.yaml", "mark", "pnpm settings: which packages run install scripts, "
                                    "registries, the pnpmfile"),
    ("**/bunfig.toml", "protect", "bun's preload scripts run on bun run/test; install "
                                  "registries route the token"),
    ("uv.toml", "protect", "uv's index URLs (and the credentials it sends there), its python "
                           "downloads and build settings"),
    ("**/.cargo/config.toml", "protect", "cargo: registry replacement, credential providers, "
                                         "rustc wrappers and runners run programs"),
    ("**/.cargo/config", "protect", "cargo: registry replacement, credential providers, "
                                    "rustc wrappers and runners run programs"),
    ("rust-toolchain.toml", "mark", "rustup's toolchain `path` sends every cargo to a program"),
    ("rust-toolchain", "mark", "rustup's toolchain `path` sends every cargo to a program"),
    (".tool-versions", "mark", "asdf's and mise's `path:` versions send node, python, … to "
                               "a program"),
    ("**/site-packages/*.pth", "mark", "Python runs their import lines at start-up"),
    ("**/site-packages/sitecustomize.py", "mark", "Python runs it at start-up"),
    ("**/site-packages/usercustomize.py", "mark", "Python runs it at start-up"),
    ("**/bin/activate", "mark", "sourced into the person's shell"),
    # what `python -m venv` and pip write in a virtualenv as a matter of course
    ("**/pyvenv.cfg", "quiet", "a virtualenv's `home`: where its Python loads the standard "
                               "library from"),
    ("<venv>/bin", "quiet", "a virtualenv's python, pip and scripts: on the person's PATH once "
                            "activated"),
    ("<venv>/lib/*/site-packages/*.pth", "quiet", "the virtualenv's Python runs their import "
                                                  "lines at start-up (pip writes them)"),
    ("**/node_modules/.bin", "quiet", "the package scripts npm, yarn and pnpm link there: run "
                                      "by `npm run` and `npx`"),
    ("<venv>/pip.conf", "mark", "the index a virtualenv's pip installs from (and sends "
                                "credentials to)"),
    (".pre-commit-config.yaml", "protect", "local hooks pre-commit runs on commit"),
    ("lefthook.yml", "protect", "commands lefthook runs on commit"),
    (".lefthook.yml", "protect", "commands lefthook runs on commit"),
    (".lfsconfig", "mark", "where git-lfs sends objects and credentials"),
    (".env", "mark", "direnv's load_dotenv and dotenv tools load it into the person's shell "
                     "(listed quietly when it is a copy of its example: QUIET_IF_COPY_OF)"),
    ("mise.toml", "protect", "mise's env, hooks and tasks (trusted by path, not content)"),
    (".mise.toml", "protect", "mise's env, hooks and tasks (trusted by path, not content)"),
    (".config/mise.toml", "protect", "mise's env, hooks and tasks (trusted by path, not "
                                                 "content)"),
    (".vscode/settings.json", "protect", "interpreter paths and terminal settings VS Code uses "
                                       "on open"),
    (".vscode/launch.json", "mark", "what VS Code runs on debug"),
    ("*.code-workspace", "protect", "VS Code workspace: its tasks (run on open), settings and "
                                 "launch configs"),
    # CI: runs with the repository's secrets once the person pushes
    (".github/workflows", "mark", "GitHub Actions runs them with the repository's secrets"),
    (".github/actions", "mark", "local actions the workflows run"),
    (".gitlab-ci.yml", "mark", "GitLab CI runs it with the project's secrets"),
    (".circleci", "mark", "CircleCI runs it with the project's secrets"),
]
PROTECT = [p for p, action, _ in ESCAPE_ROUTES if action in ("protect", "git")]
MARK = [p for p, action, _ in ESCAPE_ROUTES if action in ("mark", "quiet")]   # watched, writable
QUIET = [p for p, action, _ in ESCAPE_ROUTES if action == "quiet"]           # of those, said quietly
# A mark route said quietly when the step left it a byte-for-byte copy of one of these files
# beside it (`cp .env.example .env`): the values are the example's, which the project shows.
QUIET_IF_COPY_OF = {".env": (".env.example", ".env.sample", ".env.template", ".env.dist")}
VENV = "<venv>/"
MARK_IN_VENV = [p[len(VENV):] for p in MARK if p.startswith(VENV)]   # relative to the venv
QUIET_IN_VENV = [p[len(VENV):] for p in QUIET if p.startswith(VENV)]
MARK_IN_PROJECT = [p for p in MARK if not p.startswith(VENV)]
# What git itself leaves in a gitdir: watched in every repository found, present or not
MARK_IN_GITDIR = [p[len("**/.git/"):] for p in MARK if p.startswith("**/.git/")]
# Mark routes that are one only while they hold this (by the file's name): git rewrites
# packed-refs on gc, fetch and branch deletion, which is no route unless it packs replace refs.
MARK_IF_CONTAINS = {"packed-refs": b" refs/replace/"}


def render_escape_routes() -> str:
    """The list above as text (`envgit policy protected`, docs/POLICY.md)."""
    width = max(len(p) for p, _, _ in ESCAPE_ROUTES)
    lines = [f"{p:<{width}}  {action:<7}  {why}" for p, action, why in ESCAPE_ROUTES]
    lines += ["", "and, found per step: every repository's config, hooks, commondir and worktrees "
              "(nested ones, submodules, a .git file's target), the core.hooksPath directory "
              "named by any git config source (and its parent when it is husky's `_`), and the "
              "files those configs include",
              "<venv> is any directory holding pyvenv.cfg (a virtualenv)",
              "protect: read-only (one a step creates is taken back); mark: writable, a change is "
              "said loudly; quiet: writable, a change is listed on the step quietly (mark "
              "tool-files-written), as is a .env left a copy of its example"]
    return "\n".join(lines) + "\n"


# The person's editor and pager too: `git commit` in a step opens the editor they chose, as
# it does without envgit (the program must exist in the sandbox's view, as every command must).
ENV_PASS = ["PATH", "HOME", "LANG", "LANGUAGE", "LC_*", "TERM", "COLORTERM", "NO_COLOR",
            "TZ", "USER", "LOGNAME", "SHELL", "PYENV_ROOT", "PYENV_VERSION",
            "EDITOR", "VISUAL", "GIT_EDITOR", "PAGER", "GIT_PAGER", "LESS"]

# A variable whose name looks like this reaches the sandbox only when passed by its exact name.
SECRET_NAME_GLOBS = ["*_TOKEN", "*_TOKEN_*", "*TOKEN", "*_SECRET", "*_SECRET_*", "*SECRET",
                     "*_KEY", "*_KEY_*", "*PASSWORD*", "*PASSWD*", "*_CREDENTIALS*", "*_AUTH",
                     "*_PAT", "*APIKEY*", "*API_KEY*", "*_COOKIE*", "*SESSION*",
                     "*_PWD", "*_PASS", "*PASSPHRASE*", "*_DSN", "*DATABASE_URL*", "*_DB_URL",
                     "*WEBHOOK*", "*CONNECTION_STRING*", "*_CONN_STR*", "*PRIVATE*", "*_SIGNING_*",
                     "*_CREDS", "*_AUTH_*"]
# A value that looks like this is a secret whatever its name (for variables passed by a glob):
# a URL with a password in it, or a well-known token prefix.
SECRET_VALUE_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
                         "xoxb-", "xoxp-", "xoxa-", "xapp-", "sk-", "sk_live_", "rk_live_",
                         "AKIA", "ASIA", "AIza", "npm_", "pypi-", "hf_", "dop_v1_", "shpat_")

MAX_FILE_SIZE = 256 * 1024**2

ASK_TIMEOUT_S = 120

IRREVERSIBLE = [{"preset": "default"}]

# Network presets: `preset:NAME` in network.allow stands for every host NAME's clients reach in
# their default configuration (index, API, file and redirect hosts), on the standard ports.
# Read hosts only: upload-only hosts (upload.pypi.org, uploads.github.com) are left out, and
# the irreversible preset still judges every request on these hosts. ONE list: load.py
# expands it, `envgit policy show` and the JSON Schema print it, the init template names it.
NETWORK_PRESETS = {
    "pypi": (("pypi.org", "files.pythonhosted.org"),
             "pip, uv, poetry, pipx: the index (pypi.org/simple, /pypi/*/json) and the files"),
    "npm": (("registry.npmjs.org", "nodejs.org"),
            "npm, pnpm, npx: the registry (metadata, tarballs, audit); nodejs.org for "
            "node-gyp's headers when a native module builds"),
    "yarn": (("registry.yarnpkg.com", "repo.yarnpkg.com"),
             "yarn: its registry mirror, and yarn 2+'s own releases and plugins"),
    "crates": (("crates.io", "index.crates.io", "static.crates.io"),
               "cargo: the sparse index, the API (search, download redirects) and the .crate files"),
    "rustup": (("static.rust-lang.org",), "rustup: toolchains and components"),
    "go": (("proxy.golang.org", "sum.golang.org"),
           "go: the module proxy (also GOTOOLCHAIN downloads) and the checksum database"),
    "github": (("github.com", "api.github.com", "codeload.github.com", "raw.githubusercontent.com",
                "objects.githubusercontent.com", "release-assets.githubusercontent.com",
                "media.githubusercontent.com", "github-cloud.githubusercontent.com",
                "github-cloud.s3.amazonaws.com"),
               "git over https, the API (gh), archives (codeload), raw files, release assets, "
               "git-lfs objects"),
    "ghcr": (("ghcr.io", "pkg-containers.githubusercontent.com"),
             "GitHub's container and package registry: manifests and blobs"),
    "gitlab": (("gitlab.com", "registry.gitlab.com"),
               "git over https, the API, archives, git-lfs, the container registry"),
    "huggingface": (("huggingface.co", "hf.co", "*.hf.co", "cdn-lfs.huggingface.co",
                     "cdn-lfs-us-1.huggingface.co", "cdn-lfs-eu-1.huggingface.co"),
                    "the Hub's API and files, their CDN and Xet storage hosts (*.hf.co)"),
    "rubygems": (("rubygems.org", "index.rubygems.org"),
                 "gem, bundler: the compact index and the .gem files"),
    "maven": (("repo.maven.apache.org", "repo1.maven.org"), "Maven Central (mvn, gradle, sbt, coursier)"),
    "gradle": (("services.gradle.org", "downloads.gradle.org", "plugins.gradle.org",
                "plugins-artifacts.gradle.org"),
               "the gradle wrapper's distributions and the plugin portal (add preset:maven too)"),
    "dockerhub": (("registry-1.docker.io", "auth.docker.io", "production.cloudflare.docker.com"),
                  "Docker Hub pulls (crane, skopeo, oras): the registry, its token service, blobs"),
    "conda": (("conda.anaconda.org", "repo.anaconda.com"), "conda, mamba, pixi: conda-forge and defaults"),
}
PRESET_PREFIX = "preset:"


def presets_naming(host: str) -> list[str]:
    """The `preset:NAME` entries that would allow `host` (a hint for a denied host)."""
    h = host.strip().rstrip(".").lower()
    return [PRESET_PREFIX + name for name, (hosts, _) in NETWORK_PRESETS.items()
            if any(e == h or e.startswith("*.") and h.endswith(e[1:]) for e in hosts)]


def render_network_presets(indent: str = "", why: bool = True, width: int = 96) -> list[str]:
    """Each network preset: its name and hosts (wrapped at `width`), and what it is for."""
    name_w = len(PRESET_PREFIX) + max(len(n) for n in NETWORK_PRESETS)
    out = []
    for name, (hosts, purpose) in NETWORK_PRESETS.items():
        line = f"{indent}{PRESET_PREFIX + name:<{name_w}}  "
        cont = " " * len(line)
        for i, h in enumerate(hosts):
            word = h + ("," if i < len(hosts) - 1 else "")
            if len(line) + len(word) > width and not line.endswith("  "):
                out.append(line.rstrip())
                line = indent + cont[len(indent):]
            line += word + " "
        out.append(line.rstrip())
        if why:
            out.append(f"{indent}{' ' * name_w}  ({purpose})")
    return out

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
  # Read-only inside the writable project, added to the escape routes git, direnv, npm,
  # editors and agents obey (`envgit policy protected` lists them) and envgit.yaml itself.
  protect: []

env:
  # Passed into the sandbox besides PATH, HOME, LANG, LC_*, TERM, TZ, USER, SHELL,
  # EDITOR, VISUAL, PAGER.
  # A token-like name (*_TOKEN, *_SECRET, *_KEY, *PASSWORD*) passes only if named exactly.
  pass: []

network:
  # Hosts reachable through envgit's proxy: 'host', 'host:port', '*.domain', or a preset
  # naming every host a client needs. A loopback entry with a port ('127.0.0.1:8000',
  # 'localhost:5173': a dev server or a local registry on this machine) is reachable from
  # inside at that address, that port only. E.g.
  #   allow: [preset:pypi, preset:npm, preset:github, "localhost:5173"]
  # The presets and their hosts (also in `envgit policy show`):
@PRESETS@
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
""".replace("@PRESETS@", "\n".join(render_network_presets("  #   ", why=False)))
