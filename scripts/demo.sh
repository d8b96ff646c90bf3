#!/usr/bin/env bash
# The README's demo: start agentenv (unless one is already serving), build
# the Debian template "base" if it is missing, create a sandbox, run Python
# in it, fork it and show that the children continue from its state, serve
# a web page from the sandbox at its getHost URL over HTTPS (the server's
# local CA, names under .localhost), kill everything it made.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA_DIR=${AGENTENV_DATA_DIR:-/var/lib/agentenv}
SERVER=${AGENTENV_SERVER:-http://127.0.0.1:3000}
export AGENTENV_DATA_DIR=$DATA_DIR AGENTENV_SERVER=$SERVER
AE=bin/agentenv
# Sandbox hosts are https://<port>-<id>.$DOMAIN:3443; *.localhost resolves to
# this machine (nss-myhostname, installed by make setup; curl knows it too).
DOMAIN=agentenv.localhost

if ! curl -fsS "$SERVER/health" >/dev/null 2>&1; then
	mkdir -p "$DATA_DIR"
	echo "demo: starting agentenv serve (log: $DATA_DIR/serve.log)"
	nohup $AE serve --data-dir "$DATA_DIR" --domain "$DOMAIN" >>"$DATA_DIR/serve.log" 2>&1 &
	for _ in $(seq 1 300); do
		curl -fsS "$SERVER/health" >/dev/null 2>&1 && break
		sleep 0.2
	done
	curl -fsS "$SERVER/health" >/dev/null || { echo "demo: server did not start; see $DATA_DIR/serve.log" >&2; tail -20 "$DATA_DIR/serve.log" >&2; exit 1; }
fi

# base's packages: scripts/base-packages (python, pip, venv, node, npm as in
# E2B's default template). A base built from another list is built again.
PACKAGES=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' scripts/base-packages | paste -sd, -)
HAVE=$($AE template list --json | python3 -c '
import json, sys
for t in json.load(sys.stdin) or []:
    if t.get("templateID") == "base":
        print(",".join(t.get("packages") or []) or "-")')
if [ "$HAVE" != "$PACKAGES" ]; then
	[ -n "$HAVE" ] && echo "demo: template 'base' has other packages than scripts/base-packages: building it again"
	echo "demo: building the Debian template 'base' (debootstrap; 10 to 30 minutes the first time: npm brings ~400 packages)"
	$AE template build base --debian bookworm --packages "$PACKAGES"
fi

# E2B's code interpreter template (the @e2b/code-interpreter and
# e2b_code_interpreter SDKs' default): one command builds it on any server.
if ! $AE template list --json | python3 -c '
import json, sys
sys.exit(0 if any(t.get("templateID") == "code-interpreter-v1" for t in json.load(sys.stdin) or []) else 1)'; then
	echo "demo: building the code interpreter template 'code-interpreter-v1' (debootstrap of python3-ipykernel, numpy, pandas, matplotlib: about 5 minutes)"
	$AE template build code-interpreter-v1 --code-interpreter
fi

echo "demo: creating a sandbox from 'base'"
start=$(date +%s%N)
ID=$($AE sandbox create base --metadata demo=1)
echo "demo: sandbox $ID ready in $(( ($(date +%s%N) - start) / 1000000 )) ms"
trap '$AE sandbox kill "$ID" >/dev/null 2>&1 || true' EXIT

echo "demo: what E2B's default template offers code: python, pip, node, npm"
$AE sandbox exec "$ID" 'python -c "import sys; print(\"python\", sys.version.split()[0])" && pip --version && node -e "console.log(\"node\", process.version)" && npm --version'
echo "demo: running Python in it"
$AE sandbox exec "$ID" -- python3 -c 'import platform, sys; print("hello from", platform.python_implementation(), sys.version.split()[0], "in", platform.node()); print(sum(i*i for i in range(10**6)))'
echo "demo: starting a Python process that holds a counter in memory, then forking the sandbox into 3"
$AE sandbox exec "$ID" 'nohup python3 -c "
import socket, itertools
c = itertools.count(42)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((\"127.0.0.1\", 7000)); s.listen()
while True:
    conn, _ = s.accept(); conn.sendall(str(next(c)).encode()); conn.close()
" >/dev/null 2>&1 & sleep 0.5; echo parent-file > /tmp/state'
start=$(date +%s%N)
CHILDREN=$($AE sandbox fork "$ID" -n 3)
echo "demo: forked 3 children in $(( ($(date +%s%N) - start) / 1000000 )) ms"
trap '$AE sandbox kill "$ID" $CHILDREN >/dev/null 2>&1 || true' EXIT
ASK='python3 -c "import socket; s=socket.create_connection((\"127.0.0.1\",7000)); print(s.recv(64).decode())"'
for c in $CHILDREN; do
	echo "demo: child $c: file=$($AE sandbox exec "$c" 'cat /tmp/state') counter=$($AE sandbox exec "$c" "$ASK")"
done
echo "demo: parent: counter=$($AE sandbox exec "$ID" "$ASK") (each child continued from the same state, independently)"

echo "demo: serving a web page from the parent sandbox on port 8000, reached by its getHost URL over HTTPS"
$AE sandbox exec "$ID" "mkdir -p /tmp/www && echo 'hello from sandbox $ID over https' >/tmp/www/index.html"
$AE sandbox exec "$ID" 'cd /tmp/www && (python3 -m http.server 8000 >/dev/null 2>&1 &)'
KEY=${AGENTENV_API_KEY:-$(cat "$DATA_DIR/api-key")}
SB_DOMAIN=$(curl -fsS -H "X-API-Key: $KEY" "$SERVER/sandboxes/$ID" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("domain") or "")')
CA=$DATA_DIR/ca.pem
if [[ $SB_DOMAIN != *.localhost:* && $SB_DOMAIN != *.localhost ]] || [[ ! -f $CA ]]; then
	echo "demo: the running server has no --domain (sandbox domain: '${SB_DOMAIN}'), so getHost URLs do not work;" >&2
	echo "demo: restart it with: $AE serve --stop --data-dir $DATA_DIR && make demo" >&2
	exit 1
fi
URL="https://8000-$ID.$SB_DOMAIN/"
PAGE=""
for _ in $(seq 1 50); do
	PAGE=$(curl -fsS --cacert "$CA" "$URL" 2>/dev/null) && break
	sleep 0.2
done
if [[ $PAGE != "hello from sandbox"* ]]; then
	echo "demo: $URL did not answer as expected; the error:" >&2
	curl -sS --cacert "$CA" "$URL" >&2 || true
	exit 1
fi
echo "demo: getHost(8000) = 8000-$ID.$SB_DOMAIN"
echo "demo: curl --cacert $CA $URL"
echo "  $PAGE"
echo "demo: (E2B's SDKs: NODE_EXTRA_CA_CERTS=$CA for JavaScript, SSL_CERT_FILE=$CA for Python)"
echo "demo: E2B's code interpreter: runCode('x = 41') then runCode('x + 1') in a code-interpreter-v1 sandbox (POST /execute on its port 49999, as the SDKs send it)"
CI_ID=$($AE sandbox create code-interpreter-v1 --metadata demo=1)
trap '$AE sandbox kill "$ID" $CHILDREN "$CI_ID" >/dev/null 2>&1 || true' EXIT
PROXY=${AGENTENV_PROXY:-http://127.0.0.1:3001}
run_code() { curl -fsS -H "E2b-Sandbox-Id: $CI_ID" -H "E2b-Sandbox-Port: 49999" -H 'Content-Type: application/json' -d "$1" "$PROXY/execute"; }
run_code '{"code": "x = 41"}' >/dev/null
echo "demo: x + 1 = $(run_code '{"code": "x + 1"}' | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("type") == "result" and m.get("is_main_result"):
        print(m["text"])')"
$AE sandbox list
echo "demo: done (the server keeps running; stop it with: $AE serve --stop --data-dir $DATA_DIR)"
