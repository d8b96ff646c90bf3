#!/usr/bin/env bash
# The unprivileged test tier (internal/lifecycletest, internal/runtime/fake):
# the sandbox lifecycle on the fake runtime with --network none. The test
# binaries and envd are built as the caller (warm build cache); run as root,
# the tests then run as nobody (65534), which proves they need no
# privilege. Prints the wall time of the build and of the run.
#   scripts/test-unprivileged.sh            # with the race detector
#   RACE= scripts/test-unprivileged.sh      # without
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
RACE=${RACE--race}
dir=$(mktemp -d /tmp/agentenv-unprivileged.XXXXXX)
# Whatever a failed test left running in its directories (ours alone).
cleanup() {
	for cwd in $(find /proc/[0-9]*/cwd -maxdepth 0 -lname "$dir/*" 2>/dev/null); do
		cwd=${cwd#/proc/}
		kill -9 "${cwd%/cwd}" 2>/dev/null || true
	done
	rm -rf "$dir"
}
trap cleanup EXIT
chmod 755 "$dir"
mkdir "$dir/tmp" "$dir/home"

t0=$(date +%s%N)
CGO_ENABLED=0 $GO build -o "$dir/envd" ./cmd/envd
pkgs=(lifecycletest runtime/fake)
for p in "${pkgs[@]}"; do
	$GO test $RACE -c -o "$dir/${p//\//-}.test" "./internal/$p"
done
t1=$(date +%s%N)

as=()
if [ "$(id -u)" = 0 ]; then
	chown 65534:65534 "$dir/tmp" "$dir/home"
	as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
rc=0
for p in "${pkgs[@]}"; do
	bin="$dir/${p//\//-}.test"
	echo "== internal/$p"
	st=0
	(cd "$dir/tmp" && "${as[@]}" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$dir/home" TMPDIR="$dir/tmp" \
		AGENTENV_TEST_ENVD="$dir/envd" "$bin" -test.count=1 -test.timeout=2m -test.v) >"$bin.out" 2>&1 || st=$?
	grep -E '^(--- |ok|PASS|FAIL|panic)|_test\.go:[0-9]+:' "$bin.out" || true
	if [ "$st" != 0 ]; then
		rc=1
		echo "internal/$p failed (exit $st); its last 40 lines:"
		tail -40 "$bin.out"
	fi
done
t2=$(date +%s%N)
printf 'unprivileged tier (as uid %s): build %.1fs, tests %.1fs\n' \
	"$([ ${#as[@]} -gt 0 ] && echo 65534 || id -u)" "$(( (t1-t0)/1000000 ))e-3" "$(( (t2-t1)/1000000 ))e-3"
exit $rc
