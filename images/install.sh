#!/bin/sh
# Debian's packages `make images` builds with: runc (BuildKit's OCI worker runs every RUN step in it),
# debootstrap (the bookworm bases), gcc and libc6-dev (the static pause binary). Installed with apt when
# missing; exits 0 with a one-line reason where it cannot (no apt, not root): the build then names what lacks.
set -eu
need=""
for pair in runc:runc debootstrap:debootstrap gcc:gcc; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 \
        || need="$need ${pair#*:}"
done
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ] \
    || need="$need libc6-dev"
[ -z "$need" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "missing for make images:$need (no apt-get, or not root): sudo apt-get install$need"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $need >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $need >/dev/null
}
