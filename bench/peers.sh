#!/usr/bin/env bash
# The peer benchmark, in one command (`make bench-peers`):
#
#   bench/peers.sh                                   # the default scenarios, every contender
#   bench/peers.sh CONC KEYS SECS logged|unlogged [contender ...]
#   bench/peers.sh 64 10000 8 logged                 # one scenario, every contender
#   bench/peers.sh 64 1 8 logged ours redis_rate     # one hot key, three contenders
#   RUNS=3 bench/peers.sh                            # medians of 3 interleaved runs
#   LATENCY_MS=1 bench/peers.sh 64 1 8 logged        # every response delayed 1 ms
#   OURS_BIN=/path/to/pgratelimit bench/peers.sh     # a CLI built elsewhere (OURS_FLAGS: extra flags)
#   WORKLOAD=leases bench/peers.sh                   # only the leases: 10,000 keys and one hot key
#   bench/peers.sh 64 1 8 logged leases redis_sem    # one scenario of leases, two contenders
#
# Two workloads, both run by default (WORKLOAD=checks or leases: one of them).
# Checks: coalesce per-check (ours), async (ours_async: coalesce with --commit async,
# Config.AsyncCommit), tx pipelined upsert (pgbench), rlf, redis_rate.
# Leases, 1 of 8 units per key acquired and released at once: leases leases-per-check
# (ours_leases: pgratelimit bench --leases), redis_sem (a Redis counting semaphore).
# It installs what is missing (Debian's postgresql, redis-server, nodejs and npm; the npm
# packages of bench/rlf; the Go modules of bench/), builds this repository's CLI, the
# harness (bench/peers) and the redis_rate and redis_sem contenders, then runs the harness:
# a throwaway PostgreSQL and Redis on loopback,
# stopped and removed at the end, on Ctrl-C too. Results: a markdown table per scenario
# on stdout, and bench/results/peers-<time>.{md,json}. See bench/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
export PATH="$PATH:/usr/local/go/bin"

if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 0
fi

log() { printf 'peers: %s\n' "$*" >&2; }

# PostgreSQL's binaries: PG_BIN, else the pg_ctl on PATH, else the newest installed.
pg_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  if command -v pg_ctl >/dev/null; then dirname "$(readlink -f "$(command -v pg_ctl)")"; return; fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

# 1. Debian's packages, when missing.
command -v go >/dev/null || { log "Go is needed (this repository's toolchain): https://go.dev/doc/install"; exit 1; }
need=()
pgbin=$(pg_bin)
for t in initdb pg_ctl postgres pgbench psql; do
  [ -n "$pgbin" ] && [ -x "$pgbin/$t" ] || { need+=(postgresql); break; }
done
command -v redis-server >/dev/null || need+=(redis-server)
# Node runs rate-limiter-flexible, a contender of checks only.
node=true
[ "${WORKLOAD:-}" = leases ] && node=false
if $node; then
  command -v node >/dev/null || need+=(nodejs)
  command -v npm >/dev/null || need+=(npm)
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    log "missing: ${need[*]}; install them (sudo apt-get install ${need[*]}) or run this as root"
    exit 1
  fi
  log "installing ${need[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  # The packages start services of their own; the benchmark runs its own instances.
  for s in postgresql redis-server; do
    if [[ " ${need[*]} " == *" $s "* ]]; then service "$s" stop >/dev/null 2>&1 || true; fi
  done
  pgbin=$(pg_bin)
fi

# 2. rate-limiter-flexible and node-postgres, as locked in bench/rlf/package-lock.json.
if $node && { [ ! -f "$here/rlf/node_modules/.package-lock.json" ] ||
   [ "$here/rlf/package-lock.json" -nt "$here/rlf/node_modules/.package-lock.json" ]; }; then
  log "npm ci in bench/rlf"
  (cd "$here/rlf" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# 3. This repository's CLI (through go.work, so the library in this tree), whose load
#    benchmark (`pgratelimit bench`) is pgratelimit's contenders, and the harness and the
#    redis_rate and redis_sem contenders (bench/'s own module: go-redis stays out of the
#    library's go.mod).
# OURS_BIN=path runs the contenders of pgratelimit (coalesce, per-check, async, leases,
# leases-per-check) with a pgratelimit binary built elsewhere (another commit, say); the
# harness is this tree's.
mkdir -p "$here/.bin"
log "building ./cmd/pgratelimit"
(cd "$root" && go build -o "$here/.bin/pgratelimit" ./cmd/pgratelimit)
ours=()
if [ -n "${OURS_BIN:-}" ]; then
  log "pgratelimit contenders: $OURS_BIN"
  ours=(--ours "$(cd "$(dirname "$OURS_BIN")" && pwd)/$(basename "$OURS_BIN")")
fi
log "building bench/peers, bench/redisrate and bench/redissem"
(cd "$here" && GOWORK=off go build -o "$here/.bin/" ./peers ./redisrate ./redissem)

# 4. Run. The harness owns the servers from here on (and stops them on Ctrl-C).
exec "$here/.bin/peers" --root "$root" --pgbin "$pgbin" --bindir "$here/.bin" "${ours[@]}" "$@"
