#!/usr/bin/env bash
# Mutation testing of the modules that decide results (mutmut; docs/mutation.md says why and
# what survived). Configuration: [tool.mutmut] in pyproject.toml (modules, fast test files).
#
#   bash tools/mutation.sh                 # every scored module (about an hour on 2 cores)
#   bash tools/mutation.sh workflow.deps compilation.cudacache  # some of them (names below kbfuse)
#
# Runs mutmut in ./mutants (git-ignored; kept between runs, so a rerun only retests what
# changed), then rewrites the generated tables of docs/mutation.md from mutmut's results.
# Without arguments: every scored module (tools/mutation_report.py MODULES).
set -euo pipefail
cd "$(dirname "$0")/.."
MODULES=("$@")
mapfile -t names < <(python tools/mutation_report.py --names "${MODULES[@]}")
unset PYTHONPATH  # mutmut puts ./mutants/src first; the tests must import the mutated copy
mutmut run --max-children "${MUTMUT_CHILDREN:-2}" "${names[@]}" || true  # survivors are not an error here
python tools/mutation_report.py "${MODULES[@]}"
