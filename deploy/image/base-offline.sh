#!/bin/sh
# The Containerfile's base image, docker.io/library/python:3.11-slim-bookworm, made from Debian's own
# packages for a machine that reaches no container registry (CI's): a Debian 12 root with python3 3.11
# (at /usr/bin, where the registry's image has /usr/local/bin: the Containerfile works with both),
# python3-venv and ca-certificates, built by mmdebstrap from the Debian mirror apt uses and imported
# under the base image's name, so that `buildah bud` finds it locally and the Containerfile stays the
# one users build against the real image. About 30 s and 120 MB.
#   deploy/image/base-offline.sh [IMAGE]      (as root; apt-get install mmdebstrap buildah podman)
set -eu
image=${1:-docker.io/library/python:3.11-slim-bookworm}
for cmd in mmdebstrap podman; do
    command -v "$cmd" >/dev/null || { echo "$0: error: $cmd is missing (apt-get install $cmd)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
# docs, man pages and translations are most of a minimal root's size and nothing runs them (the
# registry's slim image leaves them out too); the copyright files stay
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$tmp/root.tar"
podman import --quiet --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' "$tmp/root.tar" "$image" >/dev/null
echo "$0: imported $image"
