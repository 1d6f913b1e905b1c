package lease

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

// FuzzCodec: Encode writes valid JSON that encoding/json reads as the same
// leases, and Decode reads it back exactly, whatever the IDs and times.
func FuzzCodec(f *testing.F) {
	f.Add("job-1", int64(1), int64(7), int64(0), int64(1e9), "b")
	f.Add(`odd "id"\ with `+"\x01\xff\u2028é", int64(1<<62), int64(-3), int64(-1), int64(1), "")
	f.Fuzz(func(t *testing.T, id string, weight, token, acq, ttl int64, id2 string) {
		base := time.Date(2026, 11, 25, 13, 0, 0, 0, time.UTC)
		ls := []Lease{
			{ID: id, Weight: weight, Token: token, AcquiredAt: base.Add(time.Duration(acq)), ExpiresAt: base.Add(time.Duration(acq + ttl)), TTL: time.Duration(ttl)},
			{ID: id2, Weight: 1, Token: token + 1, AcquiredAt: base.In(time.FixedZone("", 3600)), ExpiresAt: base.Add(time.Minute)},
		}
		col := Encode(ls)
		if !json.Valid([]byte(col)) {
			t.Fatalf("Encode wrote invalid JSON: %s", col)
		}
		var std []Lease
		if err := json.Unmarshal([]byte(col), &std); err != nil {
			t.Fatalf("encoding/json cannot read %s: %v", col, err)
		}
		got, err := Decode(col)
		if err != nil {
			t.Fatalf("Decode(%s): %v", col, err)
		}
		if !slices.EqualFunc(got, std, sameLease) {
			t.Fatalf("Decode(%s) = %+v, encoding/json reads %+v", col, got, std)
		}
		for i := range ls {
			if !ls[i].AcquiredAt.Equal(got[i].AcquiredAt) || !ls[i].ExpiresAt.Equal(got[i].ExpiresAt) ||
				ls[i].Weight != got[i].Weight || ls[i].Token != got[i].Token || ls[i].TTL != got[i].TTL {
				t.Fatalf("lease %d: wrote %+v, read %+v", i, ls[i], got[i])
			}
		}
	})
}

func sameLease(a, b Lease) bool {
	return a.ID == b.ID && a.Weight == b.Weight && a.Token == b.Token && a.AcquiredAt.Equal(b.AcquiredAt) && a.ExpiresAt.Equal(b.ExpiresAt) && a.TTL == b.TTL
}

// A column written otherwise (migration 00009's json_agg, with spaces) is
// read through encoding/json; one that is not an array of leases is an
// error, not a panic; NULL is no leases.
func TestDecodeOthers(t *testing.T) {
	got, err := Decode(`[{"id" : "a", "token" : 5, "weight" : 2, "acquired_at" : "2026-11-25T13:00:00.123456+00:00", "expires_at" : "2026-11-25T13:01:00+00:00", "ttl" : 60000000000}]`)
	want := Lease{ID: "a", Weight: 2, Token: 5, AcquiredAt: time.Date(2026, 11, 25, 13, 0, 0, 123456000, time.UTC), ExpiresAt: time.Date(2026, 11, 25, 13, 1, 0, 0, time.UTC), TTL: time.Minute}
	if err != nil || len(got) != 1 || !sameLease(got[0], want) {
		t.Fatalf("Decode = %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{`{"not": "an array"}`, `[{"id":"a","weight":"x"}]`, `[`} {
		if _, err := Decode(bad); err == nil {
			t.Errorf("Decode(%s): no error", bad)
		}
	}
	if ls, err := Decode(""); ls != nil || err != nil {
		t.Fatalf(`Decode("") = %v, %v`, ls, err)
	}
	if Encode(nil) != "" {
		t.Fatal("Encode(nil) is not NULL")
	}
}
