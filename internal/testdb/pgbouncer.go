package testdb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgratelimit/pgratelimit/internal/pglaunch"
	"github.com/pgratelimit/pgratelimit/migrations"
)

// PgBouncer starts a PgBouncer of the test's own in transaction pooling mode
// on a free loopback port, in front of the shared server, with a fresh,
// migrated database behind it. It returns a URL that connects through it.
// PgBouncer comes from Debian's package (.ci/run installs it); without it
// the test fails when CI is set and is skipped elsewhere.
func PgBouncer(t testing.TB) string {
	t.Helper()
	in := Instance(t)
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr == nil {
			bin = "/usr/sbin/pgbouncer"
		} else if os.Getenv("CI") != "" {
			t.Fatalf("pgbouncer is not installed (apt-get install pgbouncer): %v", err)
		} else {
			t.Skipf("pgbouncer is not installed (apt-get install pgbouncer): %v", err)
		}
	}
	ctx := context.Background()

	// A database of the test's own: PgBouncer passes no search_path, so the
	// tables live in its public schema.
	var b [6]byte
	_, _ = rand.Read(b[:])
	dbName := "pgb_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, in.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{dbName}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(ctx, in.URL)
		if err != nil {
			t.Errorf("dropping %s: %v", dbName, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE "+pgx.Identifier{dbName}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dropping %s: %v", dbName, err)
		}
	})
	direct, err := pgx.ParseConfig(in.URL)
	if err != nil {
		t.Fatal(err)
	}
	direct.Database = dbName
	db := stdlib.OpenDB(*direct)
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	db.Close()

	// Its ini, in a directory the postgres OS user can read when we are root.
	dir, err := pglaunch.TempDir("pgratelimit-pgbouncer-") // not t.TempDir(): its parent is root's only
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	server := direct.Config
	target := fmt.Sprintf("host=%s port=%d user=%s", server.Host, server.Port, server.User)
	if server.Password != "" {
		target += " password=" + server.Password
	}
	// A free port can be taken by another test's PgBouncer between our
	// look and its bind: then ours exits, and we try another port.
	var addr string
	for try := 0; ; try++ {
		var err error
		if addr, err = startPgBouncer(t, bin, dir, target, server.User, cred); err == nil {
			break
		} else if try == 4 {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", server.User, addr, dbName)
}

// startPgBouncer starts a PgBouncer on a free port with its files in dir,
// and returns its address once it listens there, or an error if it exited
// (its port taken meanwhile) or never listened.
func startPgBouncer(t testing.TB, bin, dir, target, user string, cred *syscall.Credential) (string, error) {
	port := freeTCPPort(t)
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
logfile = %s
pidfile = %s
`, target, port, filepath.Join(dir, "users.txt"), filepath.Join(dir, "pgbouncer.log"), filepath.Join(dir, "pgbouncer.pid"))
	for name, content := range map[string]string{
		"pgbouncer.ini": ini,
		"users.txt":     fmt.Sprintf("%q \"\"\n", user),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir = dir
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	// Tied to the test binary: it exits when the binary does, even killed.
	p, err := pglaunch.StartTied(cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	exited := p.Done()
	stop := func() {
		_ = p.Signal(syscall.SIGINT)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = p.Signal(syscall.SIGKILL)
			<-exited
		}
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			select {
			case <-exited: // another one listens there
			case <-time.After(100 * time.Millisecond):
				t.Cleanup(stop)
				return addr, nil
			}
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return "", fmt.Errorf("pgbouncer exited (port %d taken?):\n%s", port, log)
		default:
		}
		if time.Now().After(deadline) {
			stop()
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			return "", fmt.Errorf("pgbouncer did not start listening on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
