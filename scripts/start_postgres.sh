#!/usr/bin/env bash
# Start (or reuse) a local PostgreSQL server for Optuna's RDB storage, for the tests and for developers.
#
#   url=$(bash scripts/start_postgres.sh)          # prints the database URL on stdout, logs on stderr
#   export SB3_PPO_EXT_TEST_POSTGRES_URL="$url"    # what the distributed-tuning test reads
#   bash scripts/start_postgres.sh --stop          # stop it
#
# Idempotent: a server already running in the data folder is reused, an existing database kept.
# Installs Debian's postgresql package when no server binaries are found (needs root and apt-get).
# Settings (environment): SB3_PPO_EXT_PG_DATA (default /tmp/sb3_ppo_ext_pg), SB3_PPO_EXT_PG_PORT
# (default 54329), SB3_PPO_EXT_PG_DB (default optuna). The server listens on 127.0.0.1 only, with
# trust authentication (but for the test role sb3_ppo_ext_tuner): a development server, not a production one.
set -euo pipefail

data_dir=${SB3_PPO_EXT_PG_DATA:-/tmp/sb3_ppo_ext_pg}
port=${SB3_PPO_EXT_PG_PORT:-54329}
database=${SB3_PPO_EXT_PG_DB:-optuna}
log() { echo "start_postgres: $*" >&2; }

find_bindir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$dir" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return; fi
  if command -v pg_ctl >/dev/null 2>&1; then dirname "$(command -v pg_ctl)"; fi
}

bindir=$(find_bindir)
if [ -z "$bindir" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing postgresql with apt-get"
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    bindir=$(find_bindir)
  fi
  if [ -z "$bindir" ]; then
    log "no PostgreSQL server binaries found; install them (Debian/Ubuntu: apt-get install postgresql)"
    exit 1
  fi
fi

# PostgreSQL refuses to run as root: run it as the postgres user when we are root.
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  as_db_user() { runuser -u postgres -- "$@"; }
  db_user=postgres
else
  as_db_user() { "$@"; }
  db_user=$(id -un)
fi

pg_ctl() { as_db_user "$bindir/pg_ctl" -D "$data_dir" "$@"; }

if [ "${1:-}" = "--stop" ]; then
  if [ -f "$data_dir/postmaster.pid" ]; then pg_ctl stop -m fast >&2; fi
  exit 0
fi

if [ ! -f "$data_dir/PG_VERSION" ]; then
  log "initialising a cluster in $data_dir"
  rm -rf "$data_dir"
  mkdir -p "$data_dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$data_dir"
  as_db_user "$bindir/initdb" -D "$data_dir" -U "$db_user" -A trust --no-instructions >&2
fi

# One role logs in with a password, every other one is trusted: tests/test_zoo_postgres.py shows a
# URL without password working with PGPASSWORD (first matching pg_hba.conf line wins, so it goes first).
hba_line="host all sb3_ppo_ext_tuner 127.0.0.1/32 scram-sha-256"
hba_changed=0
if ! grep -qxF "$hba_line" "$data_dir/pg_hba.conf"; then
  as_db_user sh -c 'hba="$1/pg_hba.conf"; { echo "$2"; cat "$hba"; } > "$hba.new" && mv "$hba.new" "$hba"' _ "$data_dir" "$hba_line"
  hba_changed=1
fi

server_ready() { as_db_user "$bindir/pg_isready" -h 127.0.0.1 -p "$port" -q; }
if ! server_ready; then
  # A server killed without a clean shutdown (SIGKILL, a machine stop) leaves postmaster.pid
  # behind; if no server answers, that file is stale: stop whatever is left, then start afresh.
  if [ -f "$data_dir/postmaster.pid" ]; then
    log "no server answers on 127.0.0.1:$port: clearing the stale postmaster.pid"
    pg_ctl stop -m immediate -t 5 >/dev/null 2>&1 || true
    rm -f "$data_dir/postmaster.pid"
  fi
  log "starting the server on 127.0.0.1:$port"
  pg_ctl start -w -t 60 -l "$data_dir/server.log" \
    -o "-p $port -c listen_addresses=127.0.0.1 -k $data_dir -c max_connections=200" >&2
fi

if [ "$hba_changed" = 1 ]; then pg_ctl reload >&2; fi

psql() { as_db_user "$bindir/psql" -h 127.0.0.1 -p "$port" -U "$db_user" -d postgres -v ON_ERROR_STOP=1 -qtA "$@"; }
if [ "$(psql -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" != "1" ]; then
  log "creating database $database"
  psql -c "CREATE DATABASE \"$database\"" >&2
fi

echo "postgresql://$db_user@127.0.0.1:$port/$database"
