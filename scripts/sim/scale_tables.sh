#!/usr/bin/env bash
# Regenerates the tables of docs/scale.md: the published runs
# (scripts/sim/published.py) and the projections (scripts/sim/projection.py).
#   scripts/sim/scale_tables.sh build/apps/adgt-sim
set -euo pipefail
sim=${1:?usage: $0 PATH/TO/adgt-sim}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=/usr/bin/python3
[[ -x $py ]] || py=python3
"$py" "$here/published.py" --sim "$sim" --write "$root/docs/scale.md" || true
"$py" "$here/projection.py" --sim "$sim" --write "$root/docs/scale.md"
