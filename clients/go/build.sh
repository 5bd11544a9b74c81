#!/usr/bin/env bash
# Build the Go example client (clients/go) from the generated code in gen/go, offline:
# GOPATH mode over Debian's Go packages in /usr/share/gocode (grpc 1.33, protobuf 1.28,
# genproto: `make tools` installs them), no module proxy. The checkout is linked into a
# temporary GOPATH under the import path that proto/'s go_package options name.
#   clients/go/build.sh OUTPUT      (`make go` runs it; so does tests/clients/go/test_go_client.py)
set -euo pipefail
out=$(realpath -m "${1:?usage: clients/go/build.sh OUTPUT}")
root=$(cd "$(dirname "$0")/../.." && pwd)
import=github.com/runifold/runifold
gopath=$(mktemp -d)
trap 'rm -rf "$gopath"' EXIT
mkdir -p "$gopath/src/$(dirname "$import")"
ln -s "$root" "$gopath/src/$import"
# The build cache where Go keeps it, or in the temporary GOPATH when there is no home.
if [ -z "${GOCACHE:-}" ] && [ -z "${XDG_CACHE_HOME:-}" ] && [ -z "${HOME:-}" ]; then
  export GOCACHE="$gopath/cache"
fi
GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOPROXY=off GOFLAGS= \
  go build -o "$out" "$import/clients/go"
