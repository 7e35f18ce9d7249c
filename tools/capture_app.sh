#!/usr/bin/env bash
# Capture the installed jetspec-chat app as plain text, driven through tmux.
#
#   tools/capture_app.sh [options] MODEL PROMPT OUTFILE [jetspec-chat args...]
#
# Starts `jetspec-chat MODEL [args...]` in a detached tmux session of a fixed size (on a
# private tmux server, so your own tmux is never touched), waits until the model is loaded,
# types PROMPT + Enter, and captures the screen
#   OUTFILE.mid.txt      as soon as the first decode round is drawn (mid-answer)
#   OUTFILE.end.txt      once the answer is done
#   OUTFILE.compare.txt  with --compare: the budget comparison (F6) once its runs are done
# (a trailing .txt on OUTFILE is dropped first). Then it kills the session. On a timeout, a
# failed load, an engine error or a crash of the app it writes OUTFILE.error.txt (the screen at
# that moment) and exits 1 with a message saying which step failed.
#
# Options (before MODEL):
#   --compare            also run the budget comparison and capture it
#   --budgets LIST       the comparison's budgets, e.g. "AR, 16, 64" (implies --compare;
#                        default: the app's list)
#   --size COLSxROWS     terminal size (default 160x50)
#   --timeout SECONDS    limit for each step: load, answer, comparison (default 600)
#   --keep-config        use your own settings and data dirs (default: fresh temporary ones,
#                        so saved settings do not change the capture and the capture does not
#                        change them; the model cache, JETSPEC_CHAT_CACHE, is always shared)
#
# Environment: JETSPEC_CHAT_BIN (default: `jetspec-chat` on PATH), JETSPEC_CHAT_CACHE.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
}

die() {
    echo "capture_app: $*" >&2
    exit 1
}

COMPARE=0
BUDGETS=""
SIZE="160x50"
TIMEOUT=600
ISOLATE=1
while [[ $# -gt 0 ]]; do
    case "$1" in
        --compare) COMPARE=1; shift ;;
        --budgets) [[ $# -ge 2 ]] || usage; BUDGETS=$2; COMPARE=1; shift 2 ;;
        --budgets=*) BUDGETS=${1#--budgets=}; COMPARE=1; shift ;;
        --size) [[ $# -ge 2 ]] || usage; SIZE=$2; shift 2 ;;
        --size=*) SIZE=${1#--size=}; shift ;;
        --timeout) [[ $# -ge 2 ]] || usage; TIMEOUT=$2; shift 2 ;;
        --timeout=*) TIMEOUT=${1#--timeout=}; shift ;;
        --keep-config) ISOLATE=0; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) echo "capture_app: unknown option $1 (options go before MODEL)" >&2; usage ;;
        *) break ;;
    esac
done
[[ $# -ge 3 ]] || usage
MODEL=$1
PROMPT=$2
OUT=${3%.txt}
shift 3
EXTRA=("$@")

[[ $SIZE =~ ^([0-9]+)x([0-9]+)$ ]] || die "--size must look like 160x50, got '$SIZE'"
COLS=${BASH_REMATCH[1]}
ROWS=${BASH_REMATCH[2]}
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "--timeout must be a whole number of seconds, got '$TIMEOUT'"
[[ -n ${PROMPT//[[:space:]]/} ]] || die "the prompt is empty"
command -v tmux >/dev/null 2>&1 || die "tmux is not installed (apt-get install tmux)"
BIN=${JETSPEC_CHAT_BIN:-$(command -v jetspec-chat || true)}
[[ -n $BIN && -x $BIN ]] || die "jetspec-chat is not installed (pip install -e .), or set JETSPEC_CHAT_BIN"
mkdir -p "$(dirname "$OUT")"
rm -f "$OUT.mid.txt" "$OUT.end.txt" "$OUT.compare.txt" "$OUT.error.txt"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/jetspec-capture.XXXXXX")
SOCKET="jetspec-capture-$$"
SESSION="jetspec"
unset TMUX
T=(tmux -L "$SOCKET" -f /dev/null)

cleanup() {
    "${T[@]}" kill-server >/dev/null 2>&1 || true
    rm -f "${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/$SOCKET"  # kill-server leaves the socket file
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The pane runs this script: the app with a known terminal type; if the app exits, a marker
# line stays on screen (instead of the pane closing) so the failure can be captured.
{
    echo 'export TERM=xterm-256color COLORTERM=truecolor'
    if [[ $ISOLATE == 1 ]]; then
        printf 'export JETSPEC_CHAT_CONFIG=%q JETSPEC_CHAT_DATA=%q\n' "$WORK/config" "$WORK/data"
    fi
    if [[ -n ${JETSPEC_CHAT_CACHE:-} ]]; then
        printf 'export JETSPEC_CHAT_CACHE=%q\n' "$JETSPEC_CHAT_CACHE"
    fi
    printf '%q ' "$BIN" "$MODEL" "${EXTRA[@]}"
    echo
    echo 'echo "[jetspec-chat exited with status $?]"'
    echo 'sleep 86400'
} >"$WORK/run.sh"

"${T[@]}" new-session -d -s "$SESSION" -x "$COLS" -y "$ROWS" bash "$WORK/run.sh"
"${T[@]}" set-option -t "$SESSION" window-size manual >/dev/null 2>&1 || true
"${T[@]}" resize-window -t "$SESSION" -x "$COLS" -y "$ROWS" >/dev/null 2>&1 || true

SCREEN=""
snap() {
    SCREEN=$("${T[@]}" capture-pane -p -t "$SESSION" 2>/dev/null) || SCREEN="(the tmux session is gone)"
}

fail() {  # fail STEP MESSAGE: keep the screen, say what happened
    snap
    printf '%s\n' "$SCREEN" >"$OUT.error.txt"
    {
        echo "capture_app: $2 (step: $1)"
        echo "capture_app: the screen at that moment is in $OUT.error.txt; its last lines:"
        printf '%s\n' "$SCREEN" | grep -v '^[[:space:]]*$' | tail -n 15 | sed 's/^/  | /'
    } >&2
    exit 1
}

check_health() {  # on the current $SCREEN
    if grep -q '\[jetspec-chat exited with status' <<<"$SCREEN"; then
        fail "$1" "jetspec-chat exited"
    fi
    if grep -q 'Could not load the model' <<<"$SCREEN"; then
        fail "$1" "the model did not load"
    fi
    if grep -qE 'Engine error:|stopped by an engine error|Comparison failed:' <<<"$SCREEN"; then
        fail "$1" "the engine reported an error"
    fi
}

on_screen() {  # on_screen REGEX: the current $SCREEN matches (extended regex)
    grep -qE "$1" <<<"$SCREEN"
}

poll_until() {  # poll_until STEP SECONDS CMD...: 0 once CMD holds on a fresh snap, 1 after SECONDS
    local step=$1 deadline=$((SECONDS + $2))
    shift 2
    while :; do
        snap
        check_health "$step"
        "$@" && return 0
        ((SECONDS < deadline)) || return 1
        sleep 0.1
    done
}

seen_within() {  # seen_within STEP REGEX SECONDS: 0 once the screen matches, 1 after SECONDS
    poll_until "$1" "$3" on_screen "$2"
}

wait_for() {  # wait_for STEP REGEX: poll the pane until it matches, or fail on a timeout
    seen_within "$1" "$2" "$TIMEOUT" || fail "$1" "timed out after ${TIMEOUT}s"
}

save() {  # save NAME: the current $SCREEN to OUT.NAME.txt
    printf '%s\n' "$SCREEN" >"$OUT.$1.txt"
    echo "$OUT.$1.txt"
}

READY='ready +· +context [0-9]'
GENERATING='generating · round [1-9]'  # the status line
LIVE='round [1-9][0-9]*/[0-9]+ · live'  # the tree panel
DONE='[0-9]+ rounds'  # the finished answer's summary line (…tokens · … tok/s · … · N rounds)

wait_for "the model to load" "$READY"
sleep 0.5  # let the first frame after loading settle

"${T[@]}" send-keys -t "$SESSION" -l -- "$PROMPT"
"${T[@]}" send-keys -t "$SESSION" Enter

# The mid-answer frame shows a round in both the status line and the tree panel: a capture taken
# while the terminal is between redrawing the two regions shows only one of them.
mid_frame() {
    on_screen "$GENERATING" && on_screen "$LIVE"
}
mid_frame_or_done() {
    mid_frame || on_screen "$DONE"
}
poll_until "the first decode round of the answer" "$TIMEOUT" mid_frame_or_done \
    || fail "the first decode round of the answer" "timed out after ${TIMEOUT}s"
if mid_frame; then
    save mid
else
    save mid >/dev/null
    echo "capture_app: the answer finished before a mid-answer frame could be captured; $OUT.mid.txt shows the end" >&2
    echo "$OUT.mid.txt"
fi

# Done: the answer's summary line is drawn and the status line is back to ready.
deadline=$((SECONDS + TIMEOUT))
while :; do
    snap
    check_health "the end of the answer"
    if grep -qE "$DONE" <<<"$SCREEN" && grep -qE "$READY" <<<"$SCREEN"; then
        break
    fi
    ((SECONDS < deadline)) || fail "the end of the answer" "timed out after ${TIMEOUT}s"
    sleep 0.1
done
sleep 0.5  # the last tree and stats redraw
snap
save end

if [[ $COMPARE == 1 ]]; then
    "${T[@]}" send-keys -t "$SESSION" F6
    wait_for "the compare screen to open" 'Compare budgets'
    if [[ -n $BUDGETS ]]; then
        # Enter only once the field shows the list (as a literal, regex characters escaped): on a
        # loaded machine the keys can still be queued when Enter would arrive (CI once submitted
        # a half-typed list), or arrive before the field has focus and be lost; so type it again
        # (cleared first) until it shows, 5 tries
        typed=$(sed 's/[][\.^$*+?(){}|/]/\\&/g' <<<"$BUDGETS")
        for try in 1 2 3 4 5; do
            "${T[@]}" send-keys -t "$SESSION" C-e C-u
            "${T[@]}" send-keys -t "$SESSION" -l -- "$BUDGETS"
            seen_within "typing the budget list" "$typed" $((TIMEOUT / 5)) && break
            ((try < 5)) || fail "typing the budget list" "the field never showed '$BUDGETS' (typed 5 times)"
        done
    fi
    "${T[@]}" send-keys -t "$SESSION" Enter
    wait_for "the comparison runs" 'done: [0-9]+ runs|cancelled after|not a budget|out of range|enter at least one budget'
    if grep -qE 'not a budget|out of range|enter at least one budget' <<<"$SCREEN"; then
        why=$(grep -oE "[^│]*(not a budget|out of range|enter at least one budget)[^│]*" <<<"$SCREEN" | head -n 1 | sed "s/^ *//; s/ *$//")
        fail "the comparison" "the compare screen rejected the budget list '$BUDGETS': $why"
    fi
    sleep 0.5
    snap
    save compare
fi
