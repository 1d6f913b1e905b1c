package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The array parameters encode as pgx's own slices do, in binary and as
// array literals, and their binary encoding allocates nothing per element.
func TestArrayParams(t *testing.T) {
	m := pgtype.NewMap()
	at := time.Date(2026, 11, 27, 10, 0, 0, 123456000, time.UTC)
	for _, c := range []struct {
		oid  uint32
		ours any
		pgx  any
		// binary: pgx reads no interval literal of hours and seconds;
		// TestIntervalLiteral has PostgreSQL read it.
		binary bool
	}{
		{pgtype.TextArrayOID, texts{`a"b`, `c\d`, "é,{}", ""}, []string{`a"b`, `c\d`, "é,{}", ""}, false},
		{pgtype.Int8ArrayOID, int64s{-1, 0, 1 << 40}, []int64{-1, 0, 1 << 40}, false},
		{pgtype.TimestamptzArrayOID, times{at, at.Add(time.Minute), time.Time{}}, []time.Time{at, at.Add(time.Minute), time.Time{}}, false},
		{pgtype.IntervalArrayOID, durations{0, time.Second, 90*time.Minute + time.Microsecond, 1000 * time.Hour},
			[]time.Duration{0, time.Second, 90*time.Minute + time.Microsecond, 1000 * time.Hour}, true},
		{pgtype.TIDArrayOID, tids{{BlockNumber: 0, OffsetNumber: 1, Valid: true}, {BlockNumber: 1 << 31, OffsetNumber: 65535, Valid: true}},
			[]pgtype.TID{{BlockNumber: 0, OffsetNumber: 1, Valid: true}, {BlockNumber: 1 << 31, OffsetNumber: 65535, Valid: true}}, false},
	} {
		for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
			if c.binary && format == pgtype.TextFormatCode {
				continue
			}
			got, err := m.Encode(c.oid, format, c.ours, nil)
			if err != nil {
				t.Fatalf("%T, format %d: %v", c.ours, format, err)
			}
			want, err := m.Encode(c.oid, format, c.pgx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if format == pgtype.TextFormatCode {
				// The literals may differ (quoting, time zones); what
				// PostgreSQL reads from them may not.
				var ourBack, pgxBack any
				if err := m.Scan(c.oid, format, got, &ourBack); err != nil {
					t.Fatalf("%T: %s does not read back: %v", c.ours, got, err)
				}
				if err := m.Scan(c.oid, format, want, &pgxBack); err != nil {
					t.Fatal(err)
				}
				got, want = fmt.Append(nil, ourBack), fmt.Append(nil, pgxBack)
			}
			if !slices.Equal(got, want) {
				t.Errorf("%T, format %d: %q, pgx's own slice %q", c.ours, format, got, want)
			}
		}
	}

	many := make(texts, 100)
	for i := range many {
		many[i] = "key"
	}
	buf := make([]byte, 0, 4096)
	perArray := testing.AllocsPerRun(100, func() { _, _ = m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, many[:1], buf[:0]) })
	hundred := testing.AllocsPerRun(100, func() { _, _ = m.Encode(pgtype.TextArrayOID, pgtype.BinaryFormatCode, many, buf[:0]) })
	if hundred > perArray {
		t.Errorf("100 elements allocate %v times, 1 element %v: encoding allocates per element", hundred, perArray)
	}
}
