#!/usr/bin/env bash
# Regenerates the Go and Connect code of the project's protobuf services
# (api/envd, api/node) into OUT (default: this checkout). Needs protoc
# 3.21.12 (Debian's protobuf-compiler) and the plugins at go.mod's
# versions, installed into PROTOBIN (default /tmp/protobin) when absent.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.}
PROTOBIN=${PROTOBIN:-/tmp/protobin}
MODULE=github.com/agentenv/agentenv
modver() { go list -m -f '{{.Version}}' "$1"; }
if [[ ! -x $PROTOBIN/protoc-gen-go || ! -x $PROTOBIN/protoc-gen-connect-go ]]; then
	GOBIN=$PROTOBIN go install "google.golang.org/protobuf/cmd/protoc-gen-go@$(modver google.golang.org/protobuf)"
	GOBIN=$PROTOBIN go install "connectrpc.com/connect/cmd/protoc-gen-connect-go@$(modver connectrpc.com/connect)"
fi
export PATH=$PROTOBIN:$PATH
gen() { # include dir, protos...
	local inc=$1
	shift
	protoc -I "$inc" -I /usr/include \
		--go_out="$OUT" --go_opt=module=$MODULE \
		--connect-go_out="$OUT" --connect-go_opt=module=$MODULE "$@"
}
gen api/envd filesystem/filesystem.proto process/process.proto
gen api node/v1/node.proto
