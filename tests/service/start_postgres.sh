#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on 127.0.0.1:PORT for the service tests and print its DSN on stdout.
# Needs Debian's postgresql package; as root the server runs as the postgres user. Trust authentication on
# loopback only: a test server, never a deployment. Stop it with: bash tests/service/stop_postgres.sh DIR (DIR is
# printed on stderr).
set -euo pipefail
PORT=${1:-55432}
BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
DIR=$(mktemp -d /tmp/flowsim-pg.XXXXXX)
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$DIR"
as_pg "$BIN/initdb" -D "$DIR/data" -U flowsim --auth=trust -E UTF8 >"$DIR/initdb.log"
as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -c port=$PORT -c unix_socket_directories=$DIR -c max_connections=200" start >/dev/null
echo "postgres data in $DIR" >&2
echo "postgresql://flowsim@127.0.0.1:$PORT/postgres"
