#!/usr/bin/env bash
# Regenerate the rank screen goldens from a real terminal: tmux panes 80 and 200 columns wide run
# `python -m draftfit rank --target Llama-3.1-70B`; capture-pane -J keeps a line the terminal wrapped as one line.
# Run from the repository root: bash tests/data/rank_screen/capture.sh [python]
set -euo pipefail
PY=${1:-python}
HERE=tests/data/rank_screen
# An empty measurement store: the screen then depends on the repository alone (the test does the same).
STORE=$(mktemp -d)/store.sqlite
for W in 80 200; do
  S=draftfit-golden-$W-$$
  tmux new-session -d -s "$S" -x "$W" -y 400 "DRAFTFIT_STORE=$STORE $PY -m draftfit rank --target Llama-3.1-70B; echo __END__; sleep 60"
  for _ in $(seq 60); do tmux capture-pane -p -t "$S" -S - | grep -q __END__ && break; sleep 0.5; done
  tmux capture-pane -p -J -t "$S" -S - | sed -e 's/[[:space:]]*$//' -e '/^__END__$/,$d' > "$HERE/llama70b_${W}col.txt"
  tmux kill-session -t "$S"
done
