#!/usr/bin/env bash
# Run a command in a private network and mount namespace, so that two test
# runs on one host (two checkouts, a helper and a CI dry run) cannot collide:
# the tests use fixed bridge names, CIDRs and /run paths per package.
#   scripts/isolate.sh go test ./internal/server/
#   scripts/isolate.sh make test
# Needs root. Cgroups and /sys stay shared.
set -euo pipefail
if [ "${AGENTENV_ISOLATED:-}" != 1 ]; then
	exec unshare --net --mount --propagation private env AGENTENV_ISOLATED=1 "$0" "$@"
fi
mkdir -p /run/netns /run/agentenv
mount -t tmpfs tmpfs /run/netns
mount -t tmpfs tmpfs /run/agentenv
ip link set lo up
exec "$@"
