#!/usr/bin/env bash
# Installs what agentenv needs on a Debian 12 machine, from the registries
# only: apt packages, the pinned static runsc build, the e2b npm SDK used by
# the tests. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNSC_VERSION=$(cat RUNSC_VERSION)
APT_PACKAGES=(busybox-static debootstrap debian-archive-keyring erofs-utils iproute2 nftables crun curl python3)

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# runsc must be a static build of the pinned version (a dynamic one fails
# inside its own chroot), and restore needs the same build as checkpoint.
stamp=/usr/local/lib/agentenv/runsc.version
if [[ ! -x /usr/local/bin/runsc ]] || [[ "$(cat "$stamp" 2>/dev/null)" != "$RUNSC_VERSION" ]]; then
	echo "setup: building runsc $RUNSC_VERSION (static; takes a few minutes)"
	GOBIN=/usr/local/bin CGO_ENABLED=0 go install "gvisor.dev/gvisor/runsc@$RUNSC_VERSION"
	mkdir -p "$(dirname "$stamp")"
	echo "$RUNSC_VERSION" >"$stamp"
fi

if [[ -f tests/e2b/package.json ]] && [[ ! -d tests/e2b/node_modules/e2b ]]; then
	echo "setup: installing the e2b SDK for the tests"
	(cd tests/e2b && npm ci --no-audit --no-fund --loglevel=error)
fi
