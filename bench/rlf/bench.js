// rate-limiter-flexible's PostgreSQL store (RateLimiterPostgres) under the peer benchmark's
// workload: CONC checks in flight, each a consume(key, 1) of a key drawn uniformly from
// KEYS, for SECS seconds. Each consume is one upsert (INSERT ... ON CONFLICT DO UPDATE ...
// RETURNING) in autocommit: a fixed-window counter, one round trip per check.
// Usage: DATABASE_URL=... node bench.js CONC KEYS SECS logged|unlogged
// Prints one JSON line: checks, checks_per_sec, p50_ms, p99_ms, errors.
'use strict';
const { Pool } = require('pg');
const { RateLimiterPostgres } = require('rate-limiter-flexible');

const [conc, keys, secs] = process.argv.slice(2, 5).map(Number);
const tables = process.argv[5] || 'logged';
if (!(conc > 0 && keys > 0 && secs > 0) || !['logged', 'unlogged'].includes(tables)) {
  console.error('usage: node bench.js CONC KEYS SECS logged|unlogged');
  process.exit(2);
}

// One connection per check in flight, as pgbench and the other contenders have.
const pool = new Pool({ connectionString: process.env.DATABASE_URL, max: conc });
const limiter = new RateLimiterPostgres({
  storeClient: pool,
  tableName: `rlf_${tables}`, // created by bench/pgbench/schema.sql, as RateLimiterPostgres would
  tableCreated: true,
  clearExpiredByTimeout: false, // no cleanup in the run, as for every contender
  keyPrefix: 'bench',
  points: 1e9, // never denies, like the other contenders' buckets
  duration: 3600,
});

async function main() {
  const lat = [];
  let errors = 0;
  let firstError;
  const start = process.hrtime.bigint();
  const end = start + BigInt(Math.round(secs * 1e9));
  async function worker() {
    while (process.hrtime.bigint() < end) {
      const key = 'key-' + (1 + Math.floor(Math.random() * keys));
      const t = process.hrtime.bigint();
      try {
        await limiter.consume(key, 1);
        lat.push(Number(process.hrtime.bigint() - t) / 1e6);
      } catch (e) {
        // consume rejects with a RateLimiterRes when denied (never, here), with an Error on failure.
        if (e instanceof Error) {
          errors++;
          firstError = firstError || e.message;
        } else {
          lat.push(Number(process.hrtime.bigint() - t) / 1e6);
        }
      }
    }
  }
  await Promise.all(Array.from({ length: conc }, worker));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  await pool.end();
  if (firstError) console.error('first error:', firstError);
  lat.sort((a, b) => a - b);
  const q = (p) => (lat.length ? lat[Math.min(lat.length - 1, Math.floor(lat.length * p))] : 0);
  console.log(JSON.stringify({
    contender: `rlf-${tables}`, conc, keys, secs, checks: lat.length, elapsed_s: +elapsed.toFixed(3),
    checks_per_sec: Math.round(lat.length / elapsed), p50_ms: +q(0.5).toFixed(3), p99_ms: +q(0.99).toFixed(3), errors,
  }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
