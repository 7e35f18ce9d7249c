#!/usr/bin/env bash
# The run-one-command tool sends the working tree, at most 64 MiB, and the shipped heads alone are ~90 MB.
# Before the remote calls:  tools/remote-gpu/heads_aside.sh out   (engine/models/heads -> .stage/heads, git-ignored)
# After it:        tools/remote-gpu/heads_aside.sh in
# Carry a head the run needs from .stage/ (e.g. copy it to .stage/h15 and name that in carry).
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${1:?out or in} in
out) [ -d engine/models/heads ] && mkdir -p .stage && mv engine/models/heads .stage/heads && echo "engine/models/heads -> .stage/heads" ;;
in)  [ -d .stage/heads ] && mv .stage/heads engine/models/heads && echo ".stage/heads -> engine/models/heads" ;;
*)   echo "usage: $0 out|in" >&2; exit 2 ;;
esac
