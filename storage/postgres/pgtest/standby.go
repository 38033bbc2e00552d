package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StandbyName is the application_name the standby of NewReplicated
// connects to its primary with, the name synchronous_standby_names gives.
const StandbyName = "bw_standby"

// Replicated is a primary and a streaming standby, two clusters of a
// test's own on loopback.
type Replicated struct {
	Primary, Standby *Cluster
	// Sync is whether the primary waits for the standby at each commit
	// (synchronous_standby_names names it).
	Sync bool
}

// NewReplicated starts a primary (wal_level=replica, replication allowed
// from 127.0.0.1) and a standby made from it with pg_basebackup -R into
// an empty data folder, and waits until the standby streams (and, when
// sync, until the primary counts it as its synchronous standby). Both are
// removed when t ends. A test that needs it fails without PostgreSQL.
func NewReplicated(t testing.TB, sync bool) *Replicated {
	t.Helper()
	return NewReplicatedWith(t, ReplicaOptions{Sync: sync})
}

// ReplicaOptions shape a primary and its standby.
type ReplicaOptions struct {
	// Sync makes the standby synchronous.
	Sync bool
	// PrimarySettings are more settings of the primary, "name=value"
	// each, after the ones NewReplicatedWith gives it.
	PrimarySettings []string
	// Delay, when set, puts a proxy on loopback between the standby and
	// its primary that holds every byte of the replication connection
	// for Delay each way, as a standby at a distance would be.
	Delay time.Duration
}

// NewReplicatedWith is NewReplicated with options.
func NewReplicatedWith(t testing.TB, o ReplicaOptions) *Replicated {
	t.Helper()
	sync := o.Sync
	settings := []string{"wal_level=replica", "max_wal_senders=10", "wal_keep_size=256MB"}
	if sync {
		settings = append(settings, "synchronous_standby_names="+StandbyName)
	}
	settings = append(settings, o.PrimarySettings...)
	primary := NewClusterWith(t, Options{
		Settings: settings,
		Init: func(data string) error {
			return appendFile(filepath.Join(data, "pg_hba.conf"), "host replication all 127.0.0.1/32 trust\n")
		},
	})
	standby := NewClusterWith(t, Options{
		NoInitdb: true,
		Init: func(data string) error {
			conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", primary.Port(), StandbyName)
			cmd := primary.tool("pg_basebackup", "-d", conninfo, "-D", data, "-R", "-X", "stream", "-c", "fast", "--no-sync")
			if out, err := cmd.CombinedOutput(); err != nil {
				return fmt.Errorf("pg_basebackup: %v: %s", err, out)
			}
			if o.Delay > 0 {
				port, err := delayProxy(t, primary.Port(), o.Delay)
				if err != nil {
					return err
				}
				conninfo = fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", port, StandbyName)
			}
			// -R wrote standby.signal and a primary_conninfo; this one
			// (a later line wins) names the standby for
			// synchronous_standby_names.
			return appendFile(filepath.Join(data, "postgresql.auto.conf"), "primary_conninfo = '"+conninfo+"'\n")
		},
	})
	r := &Replicated{Primary: primary, Standby: standby, Sync: sync}
	want := "async"
	if sync {
		want = "sync"
	}
	if err := r.waitState(want, 30*time.Second); err != nil {
		t.Fatalf("pgtest: the standby: %v", err)
	}
	return r
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// waitState waits until the primary's pg_stat_replication shows the
// standby streaming with sync_state want.
func (r *Replicated) waitState(want string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var state string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, r.Primary.URL("postgres"))
		if err == nil {
			err = conn.QueryRow(ctx, "SELECT sync_state FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
				StandbyName).Scan(&state)
			conn.Close(ctx)
		}
		cancel()
		if err == nil && state == want {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(r.Standby.Dir(), "postgres.log"))
			return fmt.Errorf("not streaming as %s within %v (sync_state %q, %v); its log:\n%s", want, limit, state, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// MultiHostURL is the URL of database name on the primary, then the
// standby, for a client that connects to whichever of them takes writes
// (target_session_attrs=read-write).
func (r *Replicated) MultiHostURL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write&sslmode=disable",
		r.Primary.Port(), r.Standby.Port(), name)
}

// CaughtUp waits until the standby has replayed everything the primary
// has written so far (its WAL position at the call).
func (r *Replicated) CaughtUp(limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.Primary.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	for {
		var done bool
		err := conn.QueryRow(ctx, "SELECT coalesce(replay_lsn >= $2::pg_lsn, false) FROM pg_stat_replication WHERE application_name = $1",
			StandbyName, lsn).Scan(&done)
		if err == nil && done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the standby did not replay up to %s within %v (%v)", lsn, limit, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Promote makes the standby a primary (pg_ctl promote, waiting until it
// takes writes).
func (r *Replicated) Promote() error {
	out, err := r.Standby.tool("pg_ctl", "promote", "-w", "-t", "30", "-D", r.Standby.Data()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %v: %s", err, out)
	}
	return nil
}

// CreateDatabase creates database name on the primary and returns its
// URL there.
func (r *Replicated) CreateDatabase(t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.Primary.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	return r.Primary.URL(name)
}

// tool is Command for a server program that may not sit beside the
// initdb found in PATH (a link to Debian's initdb alone, say): it is
// looked for in the folder the link points to.
func (c *Cluster) tool(program string, args ...string) *exec.Cmd {
	cmd := c.Command(program, args...)
	if _, err := os.Stat(cmd.Path); err != nil {
		if real, err := filepath.EvalSymlinks(filepath.Join(c.bin, "initdb")); err == nil {
			cmd.Path = filepath.Join(filepath.Dir(real), program)
			cmd.Args[0] = cmd.Path
		}
	}
	return cmd
}

// delayProxy listens on a loopback port and forwards each connection to
// the primary's port, holding each chunk for delay in either direction.
// It stops when t ends.
func delayProxy(t testing.TB, to int, delay time.Duration) (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", to))
			if err != nil {
				c.Close()
				continue
			}
			go delayCopy(up, c, delay)
			go delayCopy(c, up, delay)
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// delayCopy copies from src to dst, each chunk written delay after it
// was read, in order; either side's end closes both.
func delayCopy(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		at time.Time
		b  []byte
	}
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				q <- chunk{time.Now().Add(delay), b[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	defer dst.Close()
	defer src.Close()
	for c := range q {
		time.Sleep(time.Until(c.at))
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}
