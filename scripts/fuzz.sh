#!/usr/bin/env bash
# Runs every fuzz target of the module for a bounded time each
# (FUZZTIME, default 10s): the parsers that take client input. A finding
# fails the run and is written under the package's testdata/fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}
status=0
while IFS=: read -r file _ line; do
	name=$(sed -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/' <<<"$line")
	pkg=./$(dirname "$file")
	echo "fuzz: $pkg $name ($FUZZTIME)"
	# Minimizing an interesting input can take a minute per input by
	# default; keep it short so the time bound holds.
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime 2s "$pkg" >/tmp/fuzz-$name.log 2>&1; then
		if grep -qx '    context deadline exceeded' /tmp/fuzz-$name.log && ! grep -q 'Failing input written' /tmp/fuzz-$name.log; then
			# Go's fuzzer, not a finding: the time bound ran out while it
			# was minimizing a new interesting input (no failing input).
			echo "fuzz: $name: time ran out while minimizing a new input (no failure found)"
			continue
		fi
		tail -30 /tmp/fuzz-$name.log
		status=1
	else
		tail -1 /tmp/fuzz-$name.log
	fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' internal cmd | sort)
exit $status
