package admin

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"
	"github.com/pgratelimit/pgratelimit/pgratelimit"
)

// Key is the stored row of a key: its bucket as its last check left it,
// and how many concurrency leases (a Semaphore's) the row holds. A key
// with no row has a full bucket and no leases.
type Key struct {
	Prefix, Key string
	// Tokens are the bucket's tokens as of RefilledAt, before the refills
	// since (Limiter.Peek counts them); negative while the key owes.
	Tokens int64
	// RefilledAt is the time Tokens are as of: the zero time for a row
	// no check has written yet (a full bucket) and for a Semaphore's key.
	RefilledAt time.Time
	// ExpiresAt is when the bucket is full again, after which cleanup may
	// delete the row.
	ExpiresAt time.Time
	// Capacity is the capacity the key was last charged under (what a
	// plan change compares with), or 0 when the row holds none.
	Capacity int64
	// Leases is how many leases the row holds, expired ones included
	// (Semaphore.Leases lists the live ones).
	Leases int
}

// KeyFilter selects keys for Keys.
type KeyFilter struct {
	// Prefix is the limiter's or semaphore's prefix (Config.Prefix).
	// Required.
	Prefix string
	// Storage is the table the prefix's keys are in (Config.Storage).
	// Defaults to pgratelimit.Durable.
	Storage pgratelimit.Storage
	// Match selects the keys that start with it. Defaults to "": every
	// key of Prefix.
	Match string
	// AfterKey selects the keys after it, in key order (bytewise): to
	// page, pass the last key seen. Defaults to "": from the first.
	AfterKey string
	// Limit is the most keys returned, at most 10000. Defaults to 100.
	Limit int
}

// maxLimit bounds KeyFilter.Limit.
const maxLimit = 10000

// Keys returns the stored rows of the keys f selects, in key order
// (bytewise), up to f.Limit, from the prefix's part of the table's primary key,
// and changes nothing.
func Keys(ctx context.Context, pool *pgxpool.Pool, f KeyFilter) ([]Key, error) {
	st, err := statements(pool, f.Prefix, f.Storage)
	if err != nil {
		return nil, err
	}
	switch {
	case f.Limit < 0 || f.Limit > maxLimit:
		return nil, fmt.Errorf("%w: KeyFilter.Limit must be in [0, %d], got %d", pgratelimit.ErrInvalidArgument, maxLimit, f.Limit)
	}
	for name, s := range map[string]string{"Match": f.Match, "AfterKey": f.AfterKey} {
		if why := engine.CheckText(s, engine.MaxKeyLen); s != "" && why != "" {
			return nil, fmt.Errorf("%w: %w: KeyFilter.%s %s", pgratelimit.ErrInvalidArgument, pgratelimit.ErrInvalidKey, name, why)
		}
	}
	limit := f.Limit
	if limit == 0 {
		limit = 100
	}
	rows, err := pool.Query(ctx, st.List, f.Prefix, f.Match, f.AfterKey, limit, above(f.Match))
	if err != nil {
		return nil, engine.DBError("list keys", err)
	}
	defer rows.Close()
	var keys []Key
	for rows.Next() {
		k := Key{Prefix: f.Prefix}
		if err := rows.Scan(&k.Key, &k.Tokens, &k.RefilledAt, &k.ExpiresAt, &k.Capacity, &k.Leases); err != nil {
			return nil, engine.DBError("list keys", err)
		}
		if k.RefilledAt.IsZero() {
			k.RefilledAt = time.Time{} // (a placeholder's, in UTC)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, engine.DBError("list keys", err)
	}
	return keys, nil
}

// above returns the least string above every key that starts with m: m
// with its last code point that has a next one incremented (and those
// after it dropped), or a string above every key for "" (or m all
// U+10FFFF). Keys compare bytewise (COLLATE "C"), which in UTF-8 is the
// order of code points.
func above(m string) string {
	rs := []rune(m)
	for i := len(rs) - 1; i >= 0; i-- {
		if rs[i] < unicode.MaxRune {
			rs[i]++
			if rs[i] == 0xD800 { // (surrogates are no characters)
				rs[i] = 0xE000
			}
			return string(rs[:i+1])
		}
	}
	return strings.Repeat(string(unicode.MaxRune), engine.MaxKeyLen/utf8.UTFMax+1)
}

// KeyCounts counts a prefix's stored keys (CountKeys).
type KeyCounts struct {
	// Keys is how many keys have a row: keys with no row have a full
	// bucket.
	Keys int64
	// Near is how many of them their last check left with at most the
	// tokens CountKeys was given, and AtLimit with none (or a debt), by
	// the bucket alone: grants are not counted. A key refilled since its
	// last check counts until its next one, or until it is full again.
	Near, AtLimit int64
}

// CountKeys counts the keys of prefix in the table of storage, and those
// near or at their limit: those whose last check left at most near tokens,
// or none. It reads every row of the prefix: on millions of keys, a second
// or more.
func CountKeys(ctx context.Context, pool *pgxpool.Pool, prefix string, storage pgratelimit.Storage, near int64) (KeyCounts, error) {
	st, err := statements(pool, prefix, storage)
	if err != nil {
		return KeyCounts{}, err
	}
	var c KeyCounts
	if err := pool.QueryRow(ctx, st.Count, prefix, near).Scan(&c.Keys, &c.Near, &c.AtLimit); err != nil {
		return KeyCounts{}, engine.DBError("count keys", err)
	}
	return c, nil
}

// statements checks the arguments every read takes and returns the
// statements of storage's table.
func statements(pool *pgxpool.Pool, prefix string, storage pgratelimit.Storage) (*sqlgen.KeyStatements, error) {
	if pool == nil {
		return nil, &pgratelimit.ConfigError{Field: "pool", Reason: "is nil"}
	}
	if why := engine.CheckText(prefix, engine.MaxPrefixLen); why != "" {
		return nil, fmt.Errorf("%w: prefix %s", pgratelimit.ErrInvalidArgument, why)
	}
	switch storage {
	case pgratelimit.Durable:
		return &sqlgen.DurableKeys, nil
	case pgratelimit.Ephemeral:
		return &sqlgen.EphemeralKeys, nil
	}
	return nil, fmt.Errorf("%w: unknown storage %d", pgratelimit.ErrInvalidArgument, storage)
}
