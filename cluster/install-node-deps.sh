#!/bin/sh
# Debian's packages the real node of `make cluster` and `make images` need: runc (the OCI runtime containerd starts),
# iptables and nftables (kube-proxy's nftables mode runs `nft`), conntrack, socat (the API server's relay
# into the node's network namespace), util-linux and iproute2 (unshare, nsenter, ip), and debootstrap
# (the images' Debian base). Installed with apt when missing; exits 0 with a one-line reason where it
# cannot (no apt, not root): the real-node tests then skip and say why. `make images` needs runc (BuildKit's
# OCI worker), debootstrap (the bookworm bases), gcc and libc6-dev (the static pause binary).
set -eu
need=""
for pair in runc:runc nft:nftables iptables:iptables conntrack:conntrack socat:socat nsenter:util-linux \
    ip:iproute2 debootstrap:debootstrap gcc:gcc; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "${pair%%:*}" >/dev/null 2>&1 \
        || need="$need ${pair#*:}"
done
[ -n "$(find /usr/lib -name libc.a -print -quit 2>/dev/null)" ] || need="$need libc6-dev"
[ -z "$need" ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
    echo "missing for the real node:$need (no apt-get, or not root): the real-node tests will skip"
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $need >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends $need >/dev/null
}
