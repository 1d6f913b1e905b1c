package citus

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/pgratelimit/pgratelimit/internal/engine"
	"github.com/pgratelimit/pgratelimit/internal/sqlgen"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pgratelimit/pgratelimit/internal/account"
)

// A node's pool is the application's pool's configuration with the host and
// port replaced (and TLS expecting the node's name), nothing else.
func TestNodePoolConfig(t *testing.T) {
	app, err := pgxpool.ParseConfig("postgres://app:secret@coordinator:5432/appdb?sslmode=disable&pool_max_conns=7&application_name=svc")
	if err != nil {
		t.Fatal(err)
	}
	app.ConnConfig.TLSConfig = &tls.Config{ServerName: "coordinator"}
	cfg, err := nodePoolConfig(app, "10.0.0.2:6432")
	if err != nil {
		t.Fatal(err)
	}
	cc := cfg.ConnConfig
	if cc.Host != "10.0.0.2" || cc.Port != 6432 || cc.Fallbacks != nil {
		t.Errorf("host %q port %d fallbacks %v, want 10.0.0.2:6432 and none", cc.Host, cc.Port, cc.Fallbacks)
	}
	if cc.User != "app" || cc.Password != "secret" || cc.Database != "appdb" || cfg.MaxConns != 7 || cc.RuntimeParams["application_name"] != "svc" {
		t.Errorf("settings not carried over: %+v, MaxConns %d", cc.Config, cfg.MaxConns)
	}
	if cc.TLSConfig.ServerName != "10.0.0.2" || app.ConnConfig.TLSConfig.ServerName != "coordinator" {
		t.Errorf("TLS server names: node %q, application %q", cc.TLSConfig.ServerName, app.ConnConfig.TLSConfig.ServerName)
	}
	if app.ConnConfig.Host != "coordinator" {
		t.Error("the application's configuration changed")
	}
}

// A request is routed when all its rows are bucket rows of one node's
// shards; not with grants, the ledger or a request ID, across nodes, or for
// a table with no map.
func TestRoute(t *testing.T) {
	whole := func(node string) *shardMap {
		return &shardMap{shards: []shardRange{{min: math.MinInt32, max: math.MaxInt32, id: 1, node: node, single: true}}}
	}
	// Two shards split at hash 0, on nodes a and b.
	split := &shardMap{shards: []shardRange{
		{min: math.MinInt32, max: -1, id: 10, node: "a:1", single: true},
		{min: 0, max: math.MaxInt32, id: 11, node: "b:1", single: true},
	}}
	var onA, onB string
	for i := 0; onA == "" || onB == ""; i++ {
		k := fmt.Sprint("k", i)
		if hashText(k) < 0 {
			onA = k
		} else {
			onB = k
		}
	}
	a, b := &Node{}, &Node{}
	r := &Router{}
	rt := &routes{tables: [2]*shardMap{engine.Durable: split}, stmts: map[int64]*sqlgen.Statements{10: {}, 11: {}},
		nodes: map[string]*Node{"a:1": a, "b:1": b}, loadedAt: time.Now()}
	r.routes.Store(rt)
	q := func(kind account.Kind, id string, cs ...engine.Charge) *engine.Request {
		return &engine.Request{Kind: kind, ID: id, Charges: cs}
	}
	c := func(s engine.Storage, key string) engine.Charge {
		return engine.Charge{Row: engine.Row{Storage: s, Prefix: "p", Key: key}}
	}
	const Durable, Ephemeral = engine.Durable, engine.Ephemeral
	for _, tc := range []struct {
		name string
		q    *engine.Request
		want *Node
	}{
		{"one key", q(account.OpCharge, "", c(Durable, onA)), a},
		{"the other node", q(account.OpCharge, "", c(Durable, onB)), b},
		{"two keys, one node", q(account.OpCharge, "", c(Durable, onB), c(Durable, onB+"x")), nil},
		{"two nodes", q(account.OpCharge, "", c(Durable, onA), c(Durable, onB)), nil},
		{"no map of the table", q(account.OpCharge, "", c(Ephemeral, onA)), nil},
		{"a request ID", q(account.OpCharge, "r1", c(Durable, onA)), nil},
		{"a refund", q(account.OpRefund, "", c(Durable, onA)), nil},
		{"grants", q(account.OpCharge, "", engine.Charge{Row: engine.Row{Storage: Durable, Prefix: "p", Key: onA}, Policy: account.Policy{Grants: true}}), nil},
		{"the ledger", q(account.OpCharge, "", engine.Charge{Row: engine.Row{Storage: Durable, Prefix: "p", Key: onA}, Policy: account.Policy{Ledger: true}}), nil},
	} {
		got, _ := r.Route(tc.q)
		if tc.name == "two keys, one node" {
			// onB+"x" may hash either way: routed exactly when both are on b.
			if hashText(onB+"x") >= 0 {
				tc.want = b
			}
		}
		if got != tc.want {
			t.Errorf("%s: routed to %p, want %p", tc.name, got, tc.want)
		}
	}
	// A shard with another placement is not routed (its copies would part).
	rt2 := *rt
	rt2.tables[engine.Durable] = whole("a:1")
	rt2.stmts = map[int64]*sqlgen.Statements{}
	r.routes.Store(&rt2)
	if got, _ := r.Route(q(account.OpCharge, "", c(Durable, onA))); got != nil {
		t.Error("a shard without statements (several placements) was routed")
	}
}

// What sends a routed check back to the coordinator: the node is
// unreachable, the shard moved, or its table is gone; nothing else.
func TestRerouted(t *testing.T) {
	_, dialErr := pgconn.Connect(context.Background(), "postgres://x@127.0.0.1:1/x?connect_timeout=1")
	if dialErr == nil || !Retry(fmt.Errorf("check: %w", dialErr)) {
		t.Errorf("a failed connection is retried: %v", dialErr)
	}
	if !Retry(engine.DBError("coalesced check", engine.ErrShardMoved)) {
		t.Error("ErrShardMoved, wrapped, is retried")
	}
	if !Retry(&pgconn.PgError{Code: "42P01"}) {
		t.Error("an undefined shard table is moved")
	}
	if Retry(&pgconn.PgError{Code: "55P03"}) || Retry(errors.New("boom")) {
		t.Error("other errors are the check's own")
	}
}
