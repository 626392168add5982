#!/usr/bin/env bash
# The GPU tests (pytest -m gpu) on a lent machine, over as many calls as they need: on an H100 they take ~14 s each
# (CUDA start, graph capture, Triton builds), 48 of them more than one 10-minute call. Each call runs the tests not
# yet finished, in collection order, until CALL_S, and records every outcome in $WORK/outcomes.txt (the machine
# keeps /tmp between calls while it is held), so the same command, repeated, walks the list:
#   device call (carry [".whl"]: pytest and its needs as wheels, see .git/info/exclude):  bash bench/gpu_tests.sh
# TESTS=FILE runs only the ids it lists (one a line) instead of every GPU test. Prints what is left;
# $OUT/gpu-tests.txt is every outcome so far (nodeid OUTCOME seconds).
# On a CPU every test skips at once, which checks this script: PY=.venv/bin/python bash bench/gpu_tests.sh
set -u -o pipefail
OUT=${OUT:-/tmp/dflash-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/gpu-tests}; mkdir -p "$WORK"; touch "$WORK/outcomes.txt"
CALL_S=${CALL_S:-560}
PY=${PY:-python3}
if [ "$PY" = python3 ] && ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 3
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# the files holding GPU tests (the others may import what the device image lacks, e.g. nbformat)
FILES=$(grep -l "mark.gpu" tests/test_*.py | tr '\n' ' ')
if [ -n "${TESTS:-}" ]; then  # a file of test ids, one a line (e.g. those an earlier session left unrun)
  grep "::" "$TESTS" > "$WORK/all.txt"
else
  $PY -m pytest --collect-only -q -p no:cacheprovider -m gpu $FILES 2>/dev/null | grep "::" > "$WORK/all.txt"
fi
cut -d' ' -f1 "$WORK/outcomes.txt" | grep -vxF -f - "$WORK/all.txt" > "$WORK/left.txt"
echo "$(wc -l < "$WORK/all.txt") GPU tests, $(wc -l < "$WORK/left.txt") not yet run"
if [ -s "$WORK/left.txt" ]; then
  # -v prints each outcome as it comes: a test cut by the call's limit is the one without a line, run again next call
  timeout "$CALL_S" $PY -m pytest -v -p no:cacheprovider -m gpu --durations=0 $(cat "$WORK/left.txt") \
    > "$WORK/last.log" 2>&1
  echo "pytest rc=$? (124: stopped at the call's limit)"
  grep -E "^tests/.*:: ?[^ ]* (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)" "$WORK/last.log" \
    | sed -E 's/^([^ ]+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS).*/\1 \2/' > "$WORK/new.txt"
  # each test's seconds from --durations (call phase), where the run got that far
  while read -r id outcome; do
    s=$(grep -E "s call +$(printf '%s' "$id" | sed 's/[][\.*^$/]/\\&/g')$" "$WORK/last.log" | awk '{print $1}' | head -1)
    echo "$id $outcome ${s:--}" >> "$WORK/outcomes.txt"
  done < "$WORK/new.txt"
  cp "$WORK/last.log" "$OUT/gpu-tests-last.log"
fi
cp "$WORK/outcomes.txt" "$OUT/gpu-tests.txt"
awk '{print $2}' "$WORK/outcomes.txt" | sort | uniq -c | tr '\n' ' '; echo
grep -E " (FAILED|ERROR) " "$WORK/outcomes.txt"
left=$(cut -d' ' -f1 "$WORK/outcomes.txt" | grep -vxF -f - "$WORK/all.txt" | wc -l)
echo "left: $left"
