#!/bin/sh
# Runs fenced's full proof matrix (every backend × fault × fencing on/off) on
# real servers started by the tests, and writes docs/proof.md and the
# timelines in docs/proof/. FENCED_PROOF_BACKENDS=sqlite,postgres limits it.
# Takes tens of minutes on a 2-core machine.
set -eu
cd "$(dirname "$0")/.."
FENCED_PROOF_OUT="$(pwd)/docs" go test -count=1 -timeout 3h -run '^TestMatrixFull$' -v ./proof/ "$@"
echo "wrote docs/proof.md"
