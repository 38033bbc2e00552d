package storage

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/server/keys"
	"breakwater/test/harness"
)

// childEnv names the database a child test process opens; childCheck
// asks it for Options.Check; childLimit asks it to limit its address
// space to what it uses plus this many MiB first.
const (
	childEnv   = "BREAKWATER_STORAGE_OPEN_CHILD"
	childCheck = "BREAKWATER_STORAGE_OPEN_CHECK"
	childLimit = "BREAKWATER_STORAGE_OPEN_LIMIT_MIB"
)

// TestOpenChild is the child side of openInChild: it opens the database
// named in childEnv, reads its keys and users, prints the outcome on one
// line and exits. Without
// childEnv it does nothing.
func TestOpenChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("runs only as openInChild's child process")
	}
	if mib := os.Getenv(childLimit); mib != "" {
		n, _ := strconv.Atoi(mib)
		if err := limitAddressSpace(uint64(n) << 20); err != nil {
			fmt.Println("SETUP:", err)
			os.Exit(3)
		}
	}
	db, err := Open(path, Options{Timeout: time.Second, Logger: quietLogger, Check: os.Getenv(childCheck) != ""})
	if err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(0)
	}
	// What every command does next: load the keys and users.
	if _, err := db.Keys(); err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(0)
	}
	if _, err := db.Users(); err != nil {
		fmt.Println("ERROR:", err)
		os.Exit(0)
	}
	_ = db.Close()
	fmt.Println("OPENED")
	os.Exit(0)
}

// limitAddressSpace sets RLIMIT_AS to this process's present size plus
// headroom bytes.
func limitAddressSpace(headroom uint64) error {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(status)) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmSize:" {
			kib, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return err
			}
			lim := kib<<10 + headroom
			return syscall.Setrlimit(syscall.RLIMIT_AS, &syscall.Rlimit{Cur: lim, Max: lim})
		}
	}
	return errors.New("no VmSize in /proc/self/status")
}

// openInChild opens the database at path in a child process, so that a
// crash (SIGBUS, an unrecovered panic) fails the test instead of ending
// the test binary, and returns the child's outcome line: "OPENED" or
// "ERROR: ...".
func openInChild(t *testing.T, path string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOpenChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), childEnv+"="+path), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the child opening %s died (%v): the open must explain, not crash:\n%.2000s", filepath.Base(path), err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("the child opening %s hangs:\n%.2000s", filepath.Base(path), out.String())
	}
	for line := range strings.Lines(out.String()) {
		if strings.HasPrefix(line, "OPENED") || strings.HasPrefix(line, "ERROR: ") {
			return strings.TrimSpace(line)
		}
	}
	t.Fatalf("no outcome from the child:\n%.2000s", out.String())
	return ""
}

// realDatabase writes a Breakwater database with enough records to span
// many pages (about 1 MiB in the events bucket, 300 users with a key
// each) and returns its path and its bytes.
func realDatabase(t *testing.T) (string, []byte) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "real.db")
	db := mustOpenPath(t, path, Options{NoSync: true})
	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for i := range 300 {
		id := fmt.Sprintf("user-%04d", i)
		k := keys.Key{ID: fmt.Sprintf("key_%04d", i), Hash: sha256.Sum256([]byte(id)), UserID: id, CreatedAt: created}
		if err := db.CreateKey(k, keys.User{Plan: "free"}); err != nil {
			t.Fatal(err)
		}
	}
	err := db.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketEvents)
		for i := range 1000 {
			k := binary.BigEndian.AppendUint64(nil, uint64(i))
			if err := b.Put(k, bytes.Repeat([]byte{byte(i)}, 1000)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, data
}

// metaOf decodes the meta page bbolt would use in data.
func metaOf(t *testing.T, data []byte) boltMeta {
	t.Helper()
	m0, _, ok0 := decodeMeta(data)
	m1, _, ok1 := decodeMeta(data[m0.pageSize:])
	if !ok0 || !ok1 {
		t.Fatal("the test database has no valid meta pages")
	}
	if m1.txid > m0.txid {
		return m1
	}
	return m0
}

// writeCopy writes data to a new file in t's temporary folder.
func writeCopy(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// zeroPage returns a copy of data with page id zeroed.
func zeroPage(data []byte, pageSize uint32, id uint64) []byte {
	c := bytes.Clone(data)
	clear(c[id*uint64(pageSize) : (id+1)*uint64(pageSize)])
	return c
}

func TestOpenDamagedFiles(t *testing.T) {
	path, data := realDatabase(t)
	m := metaOf(t, data)
	ps := uint64(m.pageSize)
	if m.pgid < 50 {
		t.Fatalf("the test database has %d pages; want a larger one", m.pgid)
	}
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(i*7 + i/251)
	}

	var usersRoot uint64
	readBolt(t, path, func(tx *bbolt.Tx) { usersRoot = uint64(tx.Bucket(bucketUsers).Root()) })
	if usersRoot < 2 || usersRoot == m.root || usersRoot == m.freelist {
		t.Fatalf("the users bucket's root is page %d (meta root %d, freelist %d): want a page of its own", usersRoot, m.root, m.freelist)
	}

	cases := []struct {
		name string
		data []byte
		want []string // in the child's outcome
		not  error    // the outcome must not be this error
	}{
		{"truncated to half", data[:m.pgid*ps/2], []string{"database is damaged", "truncated", strconv.FormatUint(m.pgid*ps/2, 10) + " bytes", "backup"}, ErrNotDatabase},
		{"truncated by one page", data[:(m.pgid-1)*ps], []string{"database is damaged", "truncated"}, ErrNotDatabase},
		{"freelist page zeroed", zeroPage(data, m.pageSize, m.freelist), []string{"database is damaged", "backup"}, ErrNotDatabase},
		{"root page zeroed", zeroPage(data, m.pageSize, m.root), []string{"database is damaged", "backup"}, ErrNotDatabase},
		{"both meta pages damaged", func() []byte {
			c := bytes.Clone(data)
			c[boltPageHeader+60]++    // meta 0's checksum
			c[ps+boltPageHeader+60]++ // meta 1's
			return c
		}(), []string{"database is damaged", "both meta pages"}, ErrNotDatabase},
		{"random bytes", random, []string{"not a breakwater database"}, ErrDamaged},
		{"text", []byte(strings.Repeat("hello, not a database\n", 1000)), []string{"not a breakwater database"}, ErrDamaged},
		{"whole file is fine", data, []string{"OPENED"}, nil},
		// A data page (not meta, root or freelist) that Open does not
		// read, and loading the users does: bbolt panicked there.
		{"data page zeroed", zeroPage(data, m.pageSize, usersRoot), []string{"database is damaged", "reading " + filepath.Join("DIR", "copy.db"),
			"Page expected to be", "backup"}, ErrNotDatabase},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // a copy and a child process of its own; the child's start is most of the time
			path := writeCopy(t, "copy.db", c.data)
			got := openInChild(t, path)
			t.Log(got)
			for _, w := range c.want {
				if w = strings.ReplaceAll(w, "DIR", filepath.Dir(path)); !strings.Contains(got, w) {
					t.Errorf("outcome %q does not say %q", got, w)
				}
			}
			if c.not != nil && strings.Contains(got, c.not.Error()) {
				t.Errorf("outcome %q says %q", got, c.not)
			}
		})
	}

	// The real binary on the damaged data page: serve and usage refuse
	// it with the message, exit 1, never a Go panic (exit 2).
	t.Run("data page zeroed, the binary", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		root, err := harness.ModuleRoot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		bin, err := harness.Build(ctx, root, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		db := writeCopy(t, "bw.db", zeroPage(data, m.pageSize, usersRoot))
		config := writeCopy(t, "config.toml", fmt.Appendf(nil, "[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n"+
			"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n", db))
		for _, args := range [][]string{{"usage"}, {"serve"}, {"keys", "list"}} {
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				cmd := exec.CommandContext(cctx, bin, append(args, "--config", config)...)
				cmd.Env = append(os.Environ(), "BREAKWATER_ADMIN_TOKEN=")
				out, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 1 {
					t.Fatalf("breakwater %s: %v, want exit 1:\n%.3000s", strings.Join(args, " "), err, out)
				}
				for _, want := range []string{"database is damaged", db, "restore the file from a backup"} {
					if !strings.Contains(string(out), want) {
						t.Errorf("breakwater %s does not say %q:\n%.3000s", strings.Join(args, " "), want, out)
					}
				}
				if strings.Contains(string(out), "goroutine ") || strings.Contains(string(out), "panic:") {
					t.Errorf("breakwater %s panicked:\n%.3000s", strings.Join(args, " "), out)
				}
			})
		}
	})
}

// TestOpenTruncatedInProcess: the size check comes before bbolt maps the
// file, so even in this process a truncated file gives an error.
func TestOpenTruncatedInProcess(t *testing.T) {
	_, data := realDatabase(t)
	m := metaOf(t, data)
	path := writeCopy(t, "cut.db", data[:m.pgid*uint64(m.pageSize)/2])
	before, _ := os.ReadFile(path)
	db, err := Open(path, Options{Timeout: 50 * time.Millisecond, Logger: quietLogger})
	if err == nil {
		db.Close()
		t.Fatal("Open succeeded on a truncated file")
	}
	if !errors.Is(err, ErrDamaged) || errors.Is(err, ErrNotDatabase) {
		t.Errorf("Open = %v, want ErrDamaged", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("Open changed the damaged file")
	}
}

// TestOpenCheck: a damaged page that opening does not touch is found by
// Options.Check, and only then.
func TestOpenCheck(t *testing.T) {
	path, data := realDatabase(t)
	var eventsRoot uint64
	readBolt(t, path, func(tx *bbolt.Tx) { eventsRoot = uint64(tx.Bucket(bucketEvents).Root()) })
	m := metaOf(t, data)
	damaged := writeCopy(t, "deep.db", zeroPage(data, m.pageSize, eventsRoot))

	if got := openInChild(t, damaged); got != "OPENED" {
		t.Errorf("without Check: %q, want OPENED (the damage is in a page Open does not read)", got)
	}
	got := openInChild(t, damaged, childCheck+"=1")
	t.Log(got)
	if !strings.Contains(got, "database is damaged") || !strings.Contains(got, fmt.Sprint(eventsRoot)) {
		t.Errorf("with Check: %q, want ErrDamaged naming page %d", got, eventsRoot)
	}
	if got := openInChild(t, writeCopy(t, "fine.db", data), childCheck+"=1"); got != "OPENED" {
		t.Errorf("with Check on a sound file: %q", got)
	}
}

// TestOpenOutOfMemory: when the file cannot be mapped for want of memory,
// Open says so, and not that the file is no database.
func TestOpenOutOfMemory(t *testing.T) {
	path, _ := realDatabase(t)
	// A sound database with 2 GiB of space after its last page: bbolt
	// maps the whole file, which the child's address-space limit refuses.
	if err := os.Truncate(path, 2<<30); err != nil {
		t.Fatal(err)
	}
	got := openInChild(t, path, childLimit+"=512")
	t.Log(got)
	if !strings.Contains(got, "not enough memory to map") || strings.Contains(got, ErrNotDatabase.Error()) {
		t.Errorf("outcome %q, want the memory shortage named", got)
	}
}
