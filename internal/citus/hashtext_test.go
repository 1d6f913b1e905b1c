package citus

import (
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

// TestMain stops the server testdb starts (without it, each run of this
// package's tests left one running).
func TestMain(m *testing.M) { testdb.Main(m) }

// Values of SELECT hashtext(k COLLATE "C") on PostgreSQL 15 (x86-64): one per
// tail length 0..4, 8, 11 and 12, and some keys as the library sees them.
func TestHashTextKnownValues(t *testing.T) {
	t.Parallel()
	for k, want := range map[string]int32{
		"":                -1477818771,
		"a":               1075015857,
		"ab":              1718550461,
		"abc":             -785388649,
		"abcd":            -393934804,
		"abcdefgh":        -1960928205,
		"abcdefghijk":     -1483803693,
		"abcdefghijkl":    -1586087212,
		"ip:203.0.113.7":  -2130660894,
		"key-123":         -1827406469,
		"héllo wörld ✓ 🚀": -1318795507,
	} {
		if got := hashText(k); got != want {
			t.Errorf("hashText(%q) = %d, PostgreSQL says %d", k, got, want)
		}
	}
}

// hashText agrees with the server's hashtext on 20,000 keys: every length
// 0..300 bytes, ASCII, multi-byte UTF-8 and the shapes keys take in practice.
func TestHashTextMatchesPostgres(t *testing.T) {
	t.Parallel()
	pool := testdb.Pool(t)
	keys := hashTestKeys(rand.New(rand.NewPCG(20, 1)), 20000)
	rows, err := pool.Query(context.Background(),
		`SELECT hashtext(k COLLATE "C") FROM unnest($1::text[]) WITH ORDINALITY AS u(k, i) ORDER BY i`, keys)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	i, mismatches := 0, 0
	for rows.Next() {
		var want int32
		if err := rows.Scan(&want); err != nil {
			t.Fatal(err)
		}
		if got := hashText(keys[i]); got != want {
			if mismatches++; mismatches <= 10 {
				t.Errorf("hashText(%q) (%d bytes) = %d, PostgreSQL says %d", keys[i], len(keys[i]), got, want)
			}
		}
		i++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if i != len(keys) || mismatches > 0 {
		t.Fatalf("compared %d of %d keys: %d differ", i, len(keys), mismatches)
	}
}

// hashTestKeys returns n valid UTF-8 keys without NUL (what a text column
// can hold): every byte length 0..300 in ASCII, then random mixes.
func hashTestKeys(rng *rand.Rand, n int) []string {
	var keys []string
	for l := 0; l <= 300; l++ {
		keys = append(keys, strings.Repeat("k", l))
	}
	runes := []rune{'a', 'Z', '~', 'é', 'ß', 'Ж', '€', '✓', '中', '🚀', '𝄞', utf8.MaxRune}
	for len(keys) < n {
		switch rng.IntN(5) {
		case 0:
			keys = append(keys, fmt.Sprintf("ip:%d.%d.%d.%d", rng.IntN(256), rng.IntN(256), rng.IntN(256), rng.IntN(256)))
		case 1:
			var b [32]byte
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			keys = append(keys, "hdr:"+hex.EncodeToString(b[:]))
		case 2:
			keys = append(keys, fmt.Sprintf("key-%d", rng.IntN(1_000_000)))
		case 3: // ASCII 1..127 (no NUL), 0..300 bytes
			b := make([]byte, rng.IntN(301))
			for i := range b {
				b[i] = byte(1 + rng.IntN(127))
			}
			keys = append(keys, string(b))
		default: // multi-byte UTF-8, at most 300 bytes
			var sb strings.Builder
			for limit := rng.IntN(301); ; {
				r := runes[rng.IntN(len(runes))]
				if sb.Len()+utf8.RuneLen(r) > limit {
					break
				}
				sb.WriteRune(r)
			}
			keys = append(keys, sb.String())
		}
	}
	return keys
}

// FuzzHashText: hashText never panics, is deterministic, and agrees with
// lookup3 written another way (the tail zero-padded to 12 bytes; mix and
// final are shared, and checked against PostgreSQL by the tests above).
func FuzzHashText(f *testing.F) {
	for _, s := range []string{"", "a", "abcdefghijk", "abcdefghijkl", "ip:203.0.113.7", "héllo wörld ✓ 🚀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := hashText(s)
		if again := hashText(strings.Clone(s)); again != h {
			t.Fatalf("hashText(%q) = %d, then %d", s, h, again)
		}
		if want := hashTextPadded(s); h != want {
			t.Fatalf("hashText(%q) = %d, the padded model says %d", s, h, want)
		}
	})
}

// hashTextPadded is lookup3's hash_bytes with the last 0..11 bytes copied
// into a zeroed 12-byte block: c's bytes go one byte up (its lowest byte is
// the length's).
func hashTextPadded(s string) int32 {
	var blocks [][12]byte
	for ; len(s) >= 12; s = s[12:] {
		blocks = append(blocks, [12]byte([]byte(s[:12])))
	}
	var tail [12]byte
	copy(tail[:], s)
	word := func(b []byte) uint32 { return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24 }
	a := 0x9e3779b9 + uint32(len(blocks)*12+len(s)) + 3923095
	b, c := a, a
	for _, bl := range blocks {
		a, b, c = hashMix(a+word(bl[0:]), b+word(bl[4:]), c+word(bl[8:]))
	}
	a, b, c = a+word(tail[0:]), b+word(tail[4:]), c+word(tail[8:])<<8
	return int32(hashFinal(a, b, c))
}
