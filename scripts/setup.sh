#!/usr/bin/env bash
# Installs what agentenv needs on a Debian 12 machine, from the registries
# only: apt packages, agentenv's static runsc build of the pinned gVisor, the
# e2b npm SDK used by the tests. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNSC_VERSION=$(cat RUNSC_VERSION)
# chromium: headless, the test of the live page (/ui) renders it in a real browser.
# python3-ipykernel, python3-matplotlib: the code interpreter server's tests run its kernels
# on the host (charts), and so do the tests of SandboxFusion's Jupyter driver.
APT_PACKAGES=(busybox-static e2fsprogs protobuf-compiler libprotobuf-dev debootstrap debian-archive-keyring erofs-utils iproute2 nftables crun curl python3 python3-pip patch libnss-myhostname chromium python3-ipykernel python3-matplotlib)

missing=()
for p in "${APT_PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "setup: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Names under *.localhost resolve to loopback through nss-myhostname, so the
# sandbox hosts of a server with a .localhost --domain (make demo's) work on
# this machine: https://<port>-<id>.agentenv.localhost. Its package adds it
# to nsswitch.conf; an edited file may lack it, so check.
if ! grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf; then
	echo "setup: adding myhostname to the hosts line of /etc/nsswitch.conf (*.localhost resolves to loopback)"
	sed -i -E 's/^(hosts:[[:space:]]+files)([[:space:]]|$)/\1 myhostname\2/' /etc/nsswitch.conf
	if ! grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf; then
		sed -i -E 's/^(hosts:.*)$/\1 myhostname/' /etc/nsswitch.conf
	fi
	grep -q '^hosts:' /etc/nsswitch.conf || echo 'hosts: files myhostname dns' >>/etc/nsswitch.conf
fi

# runsc: the pinned gVisor module built static (a dynamic build fails inside
# its own chroot) by cmd/runscbuild, with patches/gvisor applied and the
# precompiled seccomp filters a `go install` build lacks (docs/design.md,
# "The runsc build"). runsc-stub is the same build with the stub filters,
# compiled at every start: the reference of the seccomp test and the bench.
# Restore needs the same build as checkpoint; snapshots record its digest.
lib=/usr/local/lib/agentenv
runsc=/usr/local/bin/runsc
runsc_stub=$lib/runsc-stub
runsc_work=/var/cache/agentenv/runsc-build # one path: rebuilds there are incremental
stamp=$lib/runsc.version

# runsc_stamp prints what the installed builds are made of, and their digests.
runsc_stamp() {
	local inputs f
	inputs=$({
		go env GOVERSION GOARCH
		find cmd/runscbuild cmd/seccompgen internal/runscbuild patches/gvisor -type f \
			\( -name '*.go' ! -name '*_test.go' -o -name '*.patch' \) -print0 2>/dev/null |
			LC_ALL=C sort -z | xargs -0 -r sha256sum
	} | sha256sum)
	echo "version $RUNSC_VERSION"
	echo "inputs ${inputs%% *}"
	for f in "$runsc" "$runsc_stub"; do
		if [[ -f $f ]]; then
			local sum
			sum=$(sha256sum <"$f")
			echo "$(basename "$f") ${sum%% *}"
		fi
	done
}

# runsc_check BIN WANT runs /bin/true with BIN in a sandbox like agentenv's
# (EROFS root, a bind mount served by a gofer, agentenv's flags) and checks
# that the sentry's and the gofer's debug logs both say WANT.
runsc_check() {
	local bin=$1 want=$2 dir ok=0
	dir=$(mktemp -d /var/tmp/agentenv-runsc-check.XXXXXX)
	mkdir -p "$dir"/rootfs/{bin,proc,dev,sys,tmp,etc} "$dir"/bundle/rootfs "$dir"/bundle/anchor /run/agentenv/runsc-shared
	cp /bin/busybox "$dir/rootfs/bin/busybox"
	ln -s busybox "$dir/rootfs/bin/true"
	mkfs.erofs -E noinline_data "$dir/image.erofs" "$dir/rootfs" >/dev/null
	cat >"$dir/bundle/config.json" <<-JSON
		{"ociVersion": "1.0.2",
		 "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/true"], "env": ["PATH=/bin"], "cwd": "/"},
		 "root": {"path": "$dir/bundle/rootfs"},
		 "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
		  {"destination": "/tmp/.agentenv", "type": "bind", "source": "$dir/bundle/anchor", "options": ["rbind", "ro"]}],
		 "annotations": {"dev.gvisor.spec.rootfs.source": "$dir/image.erofs", "dev.gvisor.spec.rootfs.type": "erofs",
		  "dev.gvisor.spec.rootfs.overlay": "self", "dev.gvisor.spec.rootfs.options": "size=64m"},
		 "linux": {"namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}]}}
	JSON
	if "$bin" --root "$dir/state" --shared-root /run/agentenv/runsc-shared --platform systrap --network none \
		--ignore-cgroups --allow-suid --debug --debug-log "$dir/logs/" run --bundle "$dir/bundle" setupcheck \
		</dev/null >"$dir/console" 2>&1; then
		grep -qF "$want" "$dir"/logs/*.boot.txt && grep -qF "$want" "$dir"/logs/*.gofer.txt && ok=1
	fi
	"$bin" --root "$dir/state" delete --force setupcheck >/dev/null 2>&1 || true
	if ((ok)); then
		rm -rf "$dir"
		return 0
	fi
	echo "setup: $bin failed its check: the sentry's and the gofer's logs do not both say \"$want\" (see $dir)" >&2
	return 1
}

# install_bin SRC DST replaces DST atomically (running sandboxes keep theirs).
install_bin() {
	cp "$1" "$2.new.$$"
	chmod 0755 "$2.new.$$"
	mv -f "$2.new.$$" "$2"
}

if [[ "$(cat "$stamp" 2>/dev/null)" != "$(runsc_stamp)" ]]; then
	echo "setup: building runsc $RUNSC_VERSION with precompiled seccomp filters (static; the first build takes several minutes)"
	mkdir -p "$lib" "$runsc_work"
	exec 9>"$runsc_work.lock"
	flock 9
	# Another setup may have built it while this one waited for the lock.
	if [[ "$(cat "$stamp" 2>/dev/null)" != "$(runsc_stamp)" ]]; then
		out=$runsc_work/out
		go run ./cmd/runscbuild -version "$RUNSC_VERSION" -patches patches/gvisor -work "$runsc_work" -out "$out/runsc"
		go run ./cmd/runscbuild -stub -version "$RUNSC_VERSION" -patches patches/gvisor -work "$runsc_work" -out "$out/runsc-stub"
		runsc_check "$out/runsc" "Loaded precompiled seccomp instructions"
		runsc_check "$out/runsc-stub" "building seccomp program from scratch"
		install_bin "$out/runsc-stub" "$runsc_stub"
		install_bin "$out/runsc" "$runsc"
		runsc_stamp >"$stamp"
	fi
	exec 9>&-
fi

# npm ci again when a dependency package.json names is not installed
# (a checkout that added one to a tree installed before).
npm_missing() {
	node -e 'const p=require("./tests/e2b/package.json"), fs=require("fs");
		process.exit(Object.keys(p.dependencies||{}).some(d => !fs.existsSync("tests/e2b/node_modules/"+d+"/package.json")) ? 0 : 1)'
}
if [[ -f tests/e2b/package.json ]] && npm_missing; then
	echo "setup: installing the e2b SDK for the tests"
	(cd tests/e2b && npm ci --no-audit --no-fund --loglevel=error)
fi
