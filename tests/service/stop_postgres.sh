#!/usr/bin/env bash
# Stop a server that start_postgres.sh started and remove its folder: stop_postgres.sh DIR (the folder it printed).
set -euo pipefail
DIR=$1
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
as_pg "$BIN/pg_ctl" -D "$DIR/data" stop -m fast >/dev/null
rm -rf "$DIR"
