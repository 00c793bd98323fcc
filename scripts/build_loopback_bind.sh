#!/usr/bin/env bash
# Build the loopback bind library shipped with tfrun for this machine's architecture, so
# that the default network needs no compiler where tfrun is installed:
#   src/tfrun/launch/_loopback_bind.<arch>.so   and its .sha256 (of the source it is built from)
# tfrun uses the shipped copy only when that hash is the current source's
# (tests/unit/test_loopback.py checks it); otherwise it compiles the source itself.
# Options: the copy uses only glibc 2.2.5 symbols (see the source), and no builtins, so
# the compiler cannot turn its byte loops into memcpy/memset calls.
set -euo pipefail
cd "$(dirname "$0")/../src/tfrun/launch"
arch="$(uname -m)"
"${CC:-cc}" -shared -fPIC -O2 -fno-builtin -fno-tree-loop-distribute-patterns -Wall -Werror \
  -o "_loopback_bind.$arch.so" _loopback_bind.c
strip "_loopback_bind.$arch.so"
sha256sum _loopback_bind.c | cut -d' ' -f1 > "_loopback_bind.$arch.sha256"
if objdump -T "_loopback_bind.$arch.so" | grep -q 'GLIBC_2\.[3-9]'; then
  echo "needs a glibc symbol newer than 2.2.5:" >&2
  objdump -T "_loopback_bind.$arch.so" | grep GLIBC >&2
  exit 1
fi
echo "built _loopback_bind.$arch.so ($(stat -c %s "_loopback_bind.$arch.so") bytes)"
