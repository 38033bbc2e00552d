// Package pgtest gives tests a real PostgreSQL server: a fresh database per
// test on the server named by BREAKWATER_TEST_POSTGRES_URL (what .ci/run
// starts), or, when that is unset, on a throwaway cluster this package
// starts itself (initdb into a temporary folder, a loopback port, stopped
// with the test binary). A test that needs PostgreSQL fails, never skips,
// when neither is possible.
package pgtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names the variable that points tests at a running server, as a
// URL of a role that may create databases (the database in it is where
// CREATE DATABASE runs).
const EnvURL = "BREAKWATER_TEST_POSTGRES_URL"

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
	serverStop func()
)

// Main runs a test binary's tests and stops the cluster Main or
// NewDatabase started, if any: call it from TestMain.
func Main(m *testing.M) int {
	code := m.Run()
	dropTemplates()
	if serverStop != nil {
		serverStop()
	}
	return code
}

// Parallel sets go test's -parallel to n unless the command line set it:
// for a package whose tests mostly wait on processes and databases, not
// on this process's CPU, where go test's default (GOMAXPROCS slots, 2 on
// a 2-core machine) would run them nearly one after the other. Call it
// from TestMain, before Main.
func Parallel(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", fmt.Sprint(n))
	}
}

// ServerURL returns the admin URL of the server tests use, starting a
// throwaway cluster the first time when EnvURL is unset.
func ServerURL(t testing.TB) string {
	t.Helper()
	serverOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			serverURL = u
			return
		}
		c, err := startCluster(Options{})
		if err != nil {
			serverErr = err
			return
		}
		serverURL, serverStop = c.URL("postgres"), c.remove
	})
	if serverErr != nil {
		t.Fatalf("PostgreSQL is needed and none could be started (set %s to a server's URL, or install Debian's postgresql): %v", EnvURL, serverErr)
	}
	return serverURL
}

// NewDatabase creates an empty database for t and returns its URL; the
// database is dropped when t ends (its connections closed first).
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, ServerURL(t), "")
}

// newDatabase is NewDatabase on the server admin, with the clauses more
// of CREATE DATABASE (" TEMPLATE name").
func newDatabase(t testing.TB, admin, more string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bw_test_" + hex.EncodeToString(b[:])
	create := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Fatalf("pgtest: connect to %s: %v", redact(admin), err)
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "CREATE DATABASE "+name+more)
		return err
	}
	var err error
	if more == "" {
		err = create()
	} else {
		err = execAdmin(admin, "CREATE DATABASE "+name+more)
	}
	if err != nil {
		t.Fatalf("pgtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("pgtest: %s is not a URL: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Cluster is a throwaway PostgreSQL cluster in a temporary folder, its
// server a child of this process, which takes it down with it (a killed
// test binary leaves no server behind). Run as root, the server runs as the
// postgres user, since PostgreSQL refuses root.
type Cluster struct {
	bin, dir string
	port     int
	cred     *syscall.Credential
	opts     Options

	mu  sync.Mutex
	srv *exec.Cmd
}

// NewCluster starts a cluster of t's own, for a test that stops and starts
// its server; it is removed when t ends.
func NewCluster(t testing.TB) *Cluster {
	t.Helper()
	return NewClusterWith(t, Options{})
}

// Options shape a cluster of a test's own: where it listens and the
// server settings a test of replication, TLS or connection limits needs.
type Options struct {
	// Listen is the server's listen_addresses. Default 127.0.0.1.
	Listen string
	// Settings are more server settings, "name=value" each, given as -c
	// flags after the defaults (a later one wins).
	Settings []string
	// Init, when set, runs after initdb and before the first start, with
	// the data folder (pg_hba.conf, certificates, a base backup).
	Init func(data string) error
	// NoInitdb leaves the data folder empty for Init to fill (a standby's
	// base backup).
	NoInitdb bool
}

// NewClusterWith is NewCluster with options.
func NewClusterWith(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := startCluster(opts)
	if err != nil {
		t.Fatalf("pgtest: PostgreSQL is needed and could not be started (install Debian's postgresql): %v", err)
	}
	t.Cleanup(c.remove)
	return c
}

// URL is the cluster's URL for database name.
func (c *Cluster) URL(name string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, name)
}

func startCluster(opts Options) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "breakwater-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{bin: bin, dir: dir, opts: opts}
	if c.cred, err = credential(dir); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if !opts.NoInitdb {
		initdb := c.Command("initdb", "-D", c.Data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
		if out, err := initdb.CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("initdb: %v: %s", err, out)
		}
	}
	if opts.Init != nil {
		if err := opts.Init(c.Data()); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: prepare the cluster: %w", err)
		}
	}
	if c.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// Start runs the server and waits until it accepts connections.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srv != nil {
		return nil
	}
	args := []string{"-D", c.Data(), "-p", strconv.Itoa(c.port), "-k", c.dir,
		"-c", "listen_addresses=" + cmp.Or(c.opts.Listen, "127.0.0.1"), "-c", "max_connections=300"}
	for _, s := range c.opts.Settings {
		args = append(args, "-c", s)
	}
	srv := exec.Command(filepath.Join(c.bin, "postgres"), args...)
	srv.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	logf, err := os.OpenFile(filepath.Join(c.dir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	srv.Stdout, srv.Stderr = logf, logf
	err = srv.Start()
	logf.Close()
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	c.srv = srv
	u := c.URL("postgres")
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, u)
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
			return fmt.Errorf("postgres did not accept connections within 30s: %v\n%s", err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop shuts the server down (fast shutdown: open transactions are rolled
// back, connections cut) and waits for it.
func (c *Cluster) Stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srv == nil {
		return
	}
	_ = c.srv.Process.Signal(syscall.SIGINT)
	done := make(chan struct{})
	go func() { _ = c.srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.srv.Process.Kill()
		<-done
	}
	c.srv = nil
}

func (c *Cluster) remove() {
	c.Stop()
	os.RemoveAll(c.dir)
}

// binDir finds the server's binaries: Debian keeps them out of PATH.
func binDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) == 0 {
		return "", errors.New("no initdb in PATH or /usr/lib/postgresql/*/bin (apt-get install postgresql)")
	}
	return filepath.Dir(matches[len(matches)-1]), nil
}

// credential returns whom the server runs as: this process's user, or the
// postgres user (owning dir) when this process is root.
func credential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs a postgres user for the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts a throwaway cluster outside a test (a benchmark harness,
// say); the caller removes it with Remove. Its server dies with the caller.
func Start() (*Cluster, error) { return startCluster(Options{}) }

// Port is the cluster's port, Dir its folder (the server's socket is
// there), Data its data folder.
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's folder, owned by the server's user.
func (c *Cluster) Dir() string { return c.dir }

// Data is the cluster's data folder.
func (c *Cluster) Data() string { return filepath.Join(c.dir, "data") }

// Command is one of the server's programs (pg_ctl, pg_basebackup, psql),
// run as the server's user.
func (c *Cluster) Command(program string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(c.bin, program), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	return cmd
}

// Kill kills the server with SIGKILL, as a crash of its host would, and
// waits for it; Start runs it again.
func (c *Cluster) Kill() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srv == nil {
		return
	}
	_ = syscall.Kill(-c.srv.Process.Pid, syscall.SIGKILL) // its backends too
	_ = c.srv.Wait()
	c.srv = nil
}

// Remove stops the cluster's server and deletes its folder.
func (c *Cluster) Remove() { c.remove() }

// PID is the process id of the cluster's server (the postmaster), 0 while
// it is stopped: its backends are its children.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.srv == nil {
		return 0
	}
	return c.srv.Process.Pid
}
