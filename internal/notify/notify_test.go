package notify

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// A listener gets what is notified on its channel once Ready, and stops
// when Idle says so or its context ends.
func TestListen(t *testing.T) {
	pool := testdb.Pool(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := make(chan struct{})
	got := make(chan string, 4)
	done := make(chan error, 1)
	go func() {
		done <- Listen(ctx, pool.Config().ConnConfig.Copy(), Listener{
			Channel: "notify_test",
			Ready:   func() { close(ready) },
			Got:     func(p string) { got <- p },
			Idle:    func() bool { return len(got) == 2 },
		})
	}()
	<-ready
	for _, p := range []string{"one", "two"} {
		if _, err := pool.Exec(ctx, `SELECT pg_notify('notify_test', $1)`, p); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("Listen: %v", err)
	}
	if a, b := <-got, <-got; a != "one" || b != "two" {
		t.Fatalf("got %q, %q", a, b)
	}
}

// A connection that cannot be made is Listen's error; ErrPooler is for a
// pooler only.
func TestListenFails(t *testing.T) {
	pool := testdb.Pool(t)
	cfg := pool.Config().ConnConfig.Copy()
	cfg.Port = 1
	cfg.Host = "127.0.0.1"
	cfg.ConnectTimeout = time.Second
	err := Listen(context.Background(), cfg, Listener{Channel: "c", Got: func(string) {}})
	if err == nil || errors.Is(err, ErrPooler) {
		t.Fatalf("unreachable: %v", err)
	}
}
