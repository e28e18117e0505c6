#!/bin/sh
# Debian's prometheus (with promtool) for tests/prometheus and the alert-rule checks, installed with apt
# when missing. The package's own service is never started: the tests run their own prometheus on
# 127.0.0.1 with their own config and data directory. Exits 0 with a one-line reason where it cannot
# install (no apt, not root); the tests then skip and say why.
set -eu
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "prometheus/promtool missing and no apt-get here: tests/prometheus will skip (install Debian's prometheus)"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "prometheus/promtool missing and not root: tests/prometheus will skip (sudo apt-get install prometheus)"
    exit 0
fi
# invoke-rc.d asks policy-rc.d whether to start a service; 101 means no. Keep one that exists.
policy=/usr/sbin/policy-rc.d
made_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
fi
trap '[ -z "$made_policy" ] || rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q --no-install-recommends prometheus >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends prometheus >/dev/null
}
# Under systemd the unit is enabled and may have been started despite the policy: stop it.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
prometheus --version 2>&1 | head -n 1
