package alert

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

func TestDefaultBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 5: 16 * time.Second,
		12: 2048 * time.Second, 13: time.Hour, 1000: time.Hour, math.MaxInt: time.Hour, math.MinInt: time.Second} {
		if got := DefaultBackoff(n); got != want {
			t.Errorf("DefaultBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestErrorText(t *testing.T) {
	long := strings.Repeat("é", 1500) // 3000 bytes
	for _, s := range []string{"plain", "nul \x00 byte", "bad \xff utf-8", long} {
		got := errorText(errors.New(s))
		if !utf8.ValidString(got) || strings.Contains(got, "\x00") || len(got) > 2000 {
			t.Errorf("%q: %q", s[:min(len(s), 20)], got[:min(len(got), 20)])
		}
	}
}

// A handler's panic is its error, and the consumer goes on.
func TestHandlerPanic(t *testing.T) {
	d := NewDelivery(nil, DeliveryConfig{HandlerTimeout: time.Minute,
		Handler: func(context.Context, pgx.Tx, EventRow) error { panic("boom") }})
	if err := d.call(context.Background(), nil, EventRow{}); !errors.Is(err, errHandlerPanic) || !strings.Contains(err.Error(), "boom") {
		t.Errorf("%v", err)
	}
}
