"""The default preset of irreversible actions, as data: the hosts its rules name and one dict
per rule (netrules.py compiles them; network.py judges with them). No code but the lookup of a
rule's name."""

PRESET = "default"

WRITES = "POST PUT PATCH DELETE"             # "any write" for REST APIs (OPTIONS is a preflight)

# Forges and registries whose hosts the host-scoped rules below name.
GITHUB_API = ("api.github.com", "uploads.github.com")
GITLAB = ("gitlab.com", "gitlab.*")
NPM = ("registry.npmjs.org", "registry.yarnpkg.com", "npm.pkg.github.com")
PYPI_UPLOAD = ("upload.pypi.org", "test.pypi.org")
HUGGINGFACE = ("huggingface.co", "hf.co")
HF_REPO_TYPES = ("models", "datasets", "spaces", "buckets", "repos")
# GraphQL endpoints, also with a format suffix (Rails routes `/api/graphql(.:format)`) and a
# trailing slash (spelled out: a not_paths list must hold every reading, urlpath.py).
GITHUB_GRAPHQL = [p + s for p in ("/graphql", "/graphql.*") for s in ("", "/")]
GITLAB_GRAPHQL = [p + s for p in ("/api/graphql", "/api/graphql.*") for s in ("", "/")]

# Download hosts: no irreversible action is known on them, so the rules that apply to any
# host (git push, OCI push, …) skip them, and they are tunnelled untouched (no TLS
# termination; this is where bulk downloads happen). A user's own rule still applies.
DOWNLOAD_HOSTS = (
    "files.pythonhosted.org", "pypi.org", "static.crates.io", "index.crates.io",
    "objects.githubusercontent.com", "raw.githubusercontent.com", "codeload.github.com",
    "release-assets.githubusercontent.com", "pkg-containers.githubusercontent.com",
    "media.githubusercontent.com", "production.cloudflare.docker.com", "proxy.golang.org",
    "sum.golang.org", "storage.googleapis.com", "deb.debian.org", "security.debian.org",
    "archive.ubuntu.com", "security.ubuntu.com", "ports.ubuntu.com", "dl-cdn.alpinelinux.org",
    "nodejs.org", "repo.maven.apache.org", "repo1.maven.org", "cdn-lfs.huggingface.co",
    "cdn-lfs.hf.co", "cdn-lfs-us-1.hf.co", "cas-bridge.xethub.hf.co",
)

# The default preset, as data. Fields: name (cited as preset:default/<name>), kind (what the
# person reads), hosts (None: any host but DOWNLOAD_HOSTS), methods ("*": any), not_methods
# (the rule matches only if a method of the request, or an override, is not among them), paths (URL globs: `*`
# within a segment, `**` across), not_paths, header (name, values) that must be present,
# body (a predicate name from netrules.BODY_PREDICATES), hint.
PRESET_RULES: list[dict] = [
    dict(name="git-push", kind="git push", methods="POST", paths=["**/git-receive-pack"],
         body="git-ref-updates",
         hint="a push cannot be taken back; push from outside envgit, or set "
              "'- rule: git-push' with 'action: ask' in envgit.yaml"),
    dict(name="git-push-webdav", kind="git push (WebDAV)",
         methods="PUT MKCOL MOVE COPY LOCK UNLOCK PROPPATCH DELETE",
         paths=["**/objects/**", "**/refs/**", "**/info/refs"]),
    dict(name="git-lfs-upload", kind="git lfs push", methods="POST",
         paths=["**/info/lfs/objects/batch"], body="lfs-upload"),
    dict(name="npm-dist-tag", kind="npm dist-tag", hosts=NPM, methods="PUT DELETE POST",
         paths=["/-/package/**/dist-tags/**", "/-/package/**/dist-tags"]),
    dict(name="npm-access", kind="npm access/owner/team change", hosts=NPM, methods=WRITES,
         paths=["/-/package/**", "/-/org/**", "/-/team/**"]),
    dict(name="npm-unpublish", kind="npm unpublish", hosts=NPM, methods="PUT DELETE",
         paths=["/**/-rev/*"]),
    dict(name="npm-deprecate", kind="npm deprecate", hosts=NPM, methods="PUT",
         header=("npm-command", ("deprecate", "undeprecate"))),
    dict(name="npm-publish", kind="npm publish", hosts=NPM, methods="PUT POST",
         paths=["/*", "/@*/*", "/-/stage/package/**"], not_paths=["/-/user/**", "/-/v1/**"]),
    # A private registry is any host: the npm client says what it is doing in a header.
    dict(name="npm-client-write", kind="npm write", methods=WRITES,
         header=("npm-command", ("publish", "unpublish", "dist-tag", "deprecate", "undeprecate",
                                 "owner", "access", "team", "org", "star", "unstar", "hook"))),
    dict(name="pypi-upload", kind="PyPI upload", methods="POST", body="pypi-upload"),
    dict(name="pypi-legacy-upload", kind="PyPI upload", hosts=PYPI_UPLOAD, methods=WRITES),
    dict(name="cargo-publish", kind="cargo publish", methods="PUT", paths=["/api/v1/crates/new"]),
    dict(name="cargo-yank", kind="cargo yank", methods="DELETE PUT",
         paths=["/api/v1/crates/*/*/yank", "/api/v1/crates/*/*/unyank"]),
    dict(name="cargo-owners", kind="cargo owner change", methods="PUT DELETE",
         paths=["/api/v1/crates/*/owners"]),
    dict(name="oci-push", kind="image push", methods="POST PATCH PUT",
         paths=["/v2/**/blobs/uploads", "/v2/**/blobs/uploads/**", "/v2/**/manifests/*"]),
    dict(name="oci-delete", kind="image delete", methods="DELETE",
         paths=["/v2/**/manifests/*", "/v2/**/blobs/*"]),
    dict(name="github-graphql-mutation", kind="GitHub GraphQL mutation", hosts=("api.github.com",),
         methods="POST GET", paths=GITHUB_GRAPHQL, body="graphql-mutation"),
    # Only GET and POST are read as GraphQL: what a server does with a document sent by any
    # other method is not known, so that is irreversible (deny on doubt).
    dict(name="github-graphql-method", kind="GitHub GraphQL request by another method",
         hosts=("api.github.com",), methods="*", not_methods="GET POST", paths=GITHUB_GRAPHQL),
    dict(name="github-rest-write", kind="GitHub API write", hosts=GITHUB_API, methods=WRITES,
         not_paths=GITHUB_GRAPHQL),
    dict(name="gitlab-graphql-mutation", kind="GitLab GraphQL mutation", hosts=GITLAB,
         methods="POST GET", paths=GITLAB_GRAPHQL, body="graphql-mutation"),
    dict(name="gitlab-graphql-method", kind="GitLab GraphQL request by another method",
         hosts=GITLAB, methods="*", not_methods="GET POST", paths=GITLAB_GRAPHQL),
    dict(name="gitlab-rest-write", kind="GitLab API write", hosts=GITLAB, methods=WRITES,
         paths=["/api/v4/**"]),
    # Every request but a read on a repository's API is a write (commit, branch, tag,
    # super-squash, discussion merge, settings, Space secrets/hardware/restart, LFS file
    # deletion, …): an allow-list of reads, not a list of the writes known today. The one
    # read sent as POST, paths-info, stays a read (repo id: one or two segments).
    dict(name="huggingface-repo-write", kind="Hugging Face repo write", hosts=HUGGINGFACE,
         methods="*", not_methods="GET HEAD OPTIONS",
         paths=[p for t in HF_REPO_TYPES for p in (f"/api/{t}", f"/api/{t}/**")],
         not_paths=[f"/api/{t}/{r}/paths-info/*{s}" for t in HF_REPO_TYPES if t != "repos"
                    for r in ("*", "*/*") for s in ("", "/")]),
    # Uploads: a write capability for the Xet storage (a GET, but what it grants is a write),
    # and the LFS endpoints past the batch (verify, multipart completion, locks). The LFS
    # batch itself is judged by git-lfs-upload (a download batch stays allowed).
    dict(name="huggingface-upload", kind="Hugging Face upload", hosts=HUGGINGFACE,
         methods="*", paths=["/api/**/xet-write-token", "/api/**/xet-write-token/**"]),
    dict(name="huggingface-lfs-write", kind="Hugging Face upload", hosts=HUGGINGFACE,
         methods="*", not_methods="GET HEAD OPTIONS",
         paths=["/**/info/lfs/**", "/api/complete_multipart", "/api/complete_multipart/**"],
         not_paths=["/**/info/lfs/objects/batch"]),
]
PRESET_NAMES = tuple(r["name"] for r in PRESET_RULES)


def preset_rule_name(name: str) -> str | None:
    """The preset rule `name` refers to (`git-push`, `default/git-push`,
    `preset:default/git-push`), or None."""
    short = name.removeprefix("preset:").removeprefix(PRESET + "/")
    return short if short in PRESET_NAMES else None
