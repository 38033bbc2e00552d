package pgtest

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bouncer is a real PgBouncer (Debian's pgbouncer) in front of a test's
// database, on a loopback port of its own, a child of this process that
// dies with it and is stopped when the test ends. Run as root, it runs as
// the postgres user: PgBouncer refuses to run as root.
type Bouncer struct {
	port int
	dir  string
	// target is the database's URL; URL gives the same through the pooler.
	target *url.URL
	cmd    *exec.Cmd
	done   chan struct{}
}

// BouncerOptions shape a PgBouncer.
type BouncerOptions struct {
	// Mode is its pool_mode: "session" (the default), "transaction" or
	// "statement".
	Mode string
	// PoolSize is its default_pool_size, the server connections it opens
	// for one database and user. Default 20, PgBouncer's own.
	PoolSize int
	// Settings are more lines for its [pgbouncer] section, "name = value"
	// each.
	Settings []string
}

// NewBouncer starts PgBouncer in front of the database at target (a URL of
// a server on this machine, as NewDatabase or Cluster.URL give, without a
// password or with one in the URL); it forwards every database name to
// that server, authenticating clients as trusted. A missing pgbouncer
// fails t.
func NewBouncer(t testing.TB, target string, opts BouncerOptions) *Bouncer {
	t.Helper()
	b, err := startBouncer(target, opts)
	if err != nil {
		t.Fatalf("pgtest: PgBouncer is needed and could not be started (apt-get install pgbouncer): %v", err)
	}
	t.Cleanup(b.stop)
	return b
}

func startBouncer(target string, opts BouncerOptions) (*Bouncer, error) {
	prog, err := exec.LookPath("pgbouncer")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/pgbouncer"); serr != nil {
			return nil, err
		}
		prog = "/usr/sbin/pgbouncer"
	}
	u, err := url.Parse(target)
	if err != nil || u.Hostname() == "" || u.Port() == "" || u.User == nil {
		return nil, fmt.Errorf("the target %s is not a URL with a host, a port and a user", redact(target))
	}
	dir, err := os.MkdirTemp("", "breakwater-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{dir: dir, target: u, done: make(chan struct{})}
	cred, err := credential(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if b.port, err = freePort(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	user := u.User.Username()
	password, _ := u.User.Password()
	// The auth file names the users PgBouncer lets in (trust: without a
	// password) and holds the password it logs in to the server with.
	users := fmt.Sprintf("%q %q\n", user, password)
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
admin_users = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 1000
%s
`, u.Hostname(), u.Port(), b.port, filepath.Join(dir, "users.txt"), user, cmp.Or(opts.Mode, "session"),
		cmp.Or(opts.PoolSize, 20), strings.Join(opts.Settings, "\n"))
	for name, body := range map[string]string{"users.txt": users, "pgbouncer.ini": ini} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	b.cmd = exec.Command(prog, filepath.Join(dir, "pgbouncer.ini"))
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b.cmd.Stdout, b.cmd.Stderr = out, out
	err = b.cmd.Start()
	out.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	go func() { _ = b.cmd.Wait(); close(b.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)), time.Second)
		if err == nil {
			c.Close()
			return b, nil
		}
		select {
		case <-b.done:
			err = errors.New("pgbouncer exited")
		default:
		}
		if b.exited() || time.Now().After(deadline) {
			log := b.Log()
			b.stop()
			return nil, fmt.Errorf("pgbouncer did not listen on port %d: %v\n%s", b.port, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (b *Bouncer) exited() bool {
	select {
	case <-b.done:
		return true
	default:
		return false
	}
}

// URL is the target database's URL through the pooler.
func (b *Bouncer) URL() string {
	u := *b.target
	u.Host = net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
	return u.String()
}

// Port is the pooler's port.
func (b *Bouncer) Port() int { return b.port }

// Log is what PgBouncer logged so far (to its standard error), for a
// failure message.
func (b *Bouncer) Log() string {
	data, _ := os.ReadFile(filepath.Join(b.dir, "stderr.log"))
	return string(data)
}

// stop ends PgBouncer (SIGTERM: at once, its connections cut), and
// removes its folder.
func (b *Bouncer) stop() {
	if !b.exited() {
		_ = b.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-b.done:
		case <-time.After(5 * time.Second):
			_ = b.cmd.Process.Kill()
			<-b.done
		}
	}
	os.RemoveAll(b.dir)
}
