#!/bin/sh
# Builds the image localhost/offgraph:<version of pyproject.toml> from the Containerfile with buildah
# (`make image`; IMAGE=name:tag names it otherwise). Makes the base image first when this machine
# lacks it and reaches no registry (base-offline.sh). pip inside the build uses this machine's pip
# configuration: its files and the local paths they name (mirrors, wheels, constraints, the CA
# bundle) are mounted read-only, so a build works where this machine's pip does.
# Layers are cached: a rebuild after a code change reinstalls the package, not its dependencies.
set -eu
cd "$(dirname "$0")/../.."
for cmd in buildah python3; do
    command -v "$cmd" >/dev/null || { echo "$0: error: $cmd is missing (apt-get install $cmd)" >&2; exit 2; }
done
version=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
image=${IMAGE:-localhost/offgraph:$version}
base=$(sed -n 's/^ARG BASE=//p' Containerfile)
if ! buildah inspect --type image "$base" >/dev/null 2>&1; then
    if ! buildah pull --quiet "$base" >/dev/null 2>&1; then
        echo "$0: no registry gives $base: building it from Debian's packages" >&2
        deploy/image/base-offline.sh "$base"
    fi
fi
# one -v per pip configuration file (a user's becomes the build's root user's) and per existing path it names
mounts=$(python3 - <<'PY'
import os, re

user = [os.path.expanduser(p) for p in ("~/.config/pip/pip.conf", "~/.pip/pip.conf")]
files = ["/etc/pip.conf", "/etc/xdg/pip/pip.conf", os.environ.get("PIP_CONFIG_FILE") or "", *user]
paths = {}
for f in filter(os.path.isfile, files):
    inside = f if f.startswith("/etc/") else "/root/.config/pip/pip.conf"
    if inside not in paths.values():
        paths[f] = inside
    for p in re.findall(r"(?:file://)?(/[^\s'\",]+)", open(f).read()):
        p = p.rstrip("/")
        if os.path.basename(p) == "simple":  # an index's pages link to files beside it (../../files/)
            p = os.path.dirname(p)
        if os.path.exists(p):
            paths.setdefault(p, p)
print(" ".join(f"-v {src}:{dst}:ro" for src, dst in sorted(paths.items())))
PY
)
echo "$0: building $image" >&2
old=$(buildah images --quiet --no-trunc "$image" 2>/dev/null | sed "s/^sha256://" || true)
# shellcheck disable=SC2086 # $mounts: one word per -v
buildah bud --isolation chroot --network host --layers --format docker $mounts \
    --file Containerfile --tag "$image" .
# the image this one replaced goes (its venv layer is 2 GB); the cached layers of the build stay
new=$(buildah images --quiet --no-trunc "$image" | sed "s/^sha256://")
if [ -n "$old" ] && [ "$old" != "$new" ]; then
    buildah rmi "$old" >/dev/null 2>&1 || true
fi
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$image"
