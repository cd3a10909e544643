#!/bin/sh
# Make docs/reports/ from the recordings in recordings/, in one command (run from the repository root):
#   make reports        (or scripts/make-reports.sh; the reports are not committed: ~62 MB, made in ~3 min of CPU)
# Each recordings/NAME.db becomes docs/reports/NAME/ (report.md, report.html, figures as PNG/SVG/PDF, figures.json);
# a folder recordings/NAME/ of several recordings (the same experiment at several world sizes) becomes one report
# docs/reports/NAME/ comparing them (HPML Lab 4's speedup tables). A report names the recording it was made from
# (path and SHA-256), so a report and its recording can be told apart from any other run.
# PYTHON picks the interpreter (default: the repository's .venv).
set -eu
PYTHON=${PYTHON:-.venv/bin/python}
[ -d recordings ] || { echo "run from the repository root" >&2; exit 2; }
mkdir -p docs/reports
made=0
for src in recordings/*.db recordings/*/; do
    [ -e "$src" ] || continue
    name=$(basename "$src" .db)
    if [ -d "$src" ]; then
        set -- "$src"*.db
        [ -e "$1" ] || continue
    else
        set -- "$src"
    fi
    # lab.md: the lab's own tables (link utilization, NIC bytes per host), written by `ddptop lab --record-dir` from
    # the same recordings and the lab's link rate, which only the lab knows: kept across a regeneration
    kept=""
    if [ -f "docs/reports/$name/lab.md" ]; then kept=$(mktemp); cp "docs/reports/$name/lab.md" "$kept"; fi
    rm -rf "docs/reports/$name"
    "$PYTHON" -m ddptop report "$@" -o "docs/reports/$name"
    if [ -n "$kept" ]; then mv "$kept" "docs/reports/$name/lab.md"; fi
    made=$((made + 1))
done
echo "$made report(s) in docs/reports/"
