package cli_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// restoreLine is the restore command of the PostgreSQL backups: the one
// line of the ```sh block that runs psql, in each document that shows it,
// where it must be the same.
func restoreLine(t *testing.T) string {
	t.Helper()
	var line string
	for _, doc := range []string{"docs/OPERATIONS.md", "docs/INSTANCES.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile("(?m)^```sh\n(psql [^\n]*)\n```$").FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("%s shows no restore command (a ```sh block of one psql line)", doc)
		}
		if line != "" && m[1] != line {
			t.Errorf("%s restores with %q, the other document with %q", doc, m[1], line)
		}
		line = m[1]
	}
	return line
}

// pgBinPath is PATH with PostgreSQL's client folder after it, where Debian
// keeps psql when it is not on PATH.
func pgBinPath() string {
	path := os.Getenv("PATH")
	if dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin"); len(dirs) > 0 {
		path += string(os.PathListSeparator) + dirs[len(dirs)-1]
	}
	return path
}

// The documents' restore command, run as written on the backup of a
// database that served paid reads, makes a new, empty database that an
// instance starts on with the same figures: usage, quotas and budget as
// the operator's commands show them, the keys working, and new reads
// going on from there. The documented file name is what backup --dir
// writes on PostgreSQL, and restoring onto the restored database is
// refused whole.
func TestPostgresBackupRestoresAsDocumented(t *testing.T) {
	line := restoreLine(t)
	if _, err := exec.LookPath("psql"); err != nil && pgBinPath() == os.Getenv("PATH") {
		t.Fatal("psql is needed to restore a backup (apt-get install postgresql-client)")
	}
	file := regexp.MustCompile(` -f (\S+) `).FindStringSubmatch(line)
	if file == nil || !regexp.MustCompile(`^breakwater-\d{4}-\d{2}-\d{2}T\d{4}Z\.sql$`).MatchString(file[1]) {
		t.Fatalf("the restore command %q names no file as backup --dir names it on PostgreSQL", line)
	}
	config := writeConfig(t, instancesTOML(t)+`
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
daily_attempts = 50
[budget]
daily_requests = 1000
`)
	live := map[string]string{postgres.EnvURL: pgtest.NewDatabase(t), "BREAKWATER_SECRET": migrateSecret}
	keys := serveReads(t, config, live, map[string]int{"alice": 3, "bob": 1})
	want := figures(t, config, live)

	dir := t.TempDir()
	if out, err := cliRun(config, live, "backup", filepath.Join(dir, file[1])); err != nil {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	restored := map[string]string{postgres.EnvURL: pgtest.NewDatabase(t), "BREAKWATER_SECRET": migrateSecret}
	psql := func() (string, error) {
		cmd := exec.Command("sh", "-c", line)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "PATH="+pgBinPath(), postgres.EnvURL+"="+restored[postgres.EnvURL])
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := psql(); err != nil {
		t.Fatalf("the documented restore: %v\n%s", err, out)
	}
	if got := figures(t, config, restored); got != want {
		t.Errorf("the restored database's figures:\n%s\nwant the backup's:\n%s", got, want)
	}
	if out, err := psql(); err == nil || !strings.Contains(out, "holds Breakwater's tables already") {
		t.Errorf("a restore onto the restored database: %v\n%s\nwant it refused", err, out)
	}
	// An instance starts on it: the keys work and reads go on from the
	// restored figures.
	serveReadsWith(t, config, restored, keys, map[string]int{"alice": 1})
	after := figures(t, config, restored)
	if !strings.Contains(after, `"reads_month": 4`) || !strings.Contains(after, `"requests_today": 5`) {
		t.Errorf("after one more read of alice's on the restored database:\n%s\nwant 4 reads of hers this month and 5 calls today", after)
	}
	checkDatedPostgresBackup(t, config, live)
}

// cliRun runs breakwater with args and --config config in env, and returns
// what it printed.
func cliRun(config string, env map[string]string, args ...string) (string, error) {
	var out bytes.Buffer
	err := run(context.Background(), append(args, "--config", config), envFrom(env), &out, &out)
	return out.String(), err
}

// serveReads makes a key for each user and has an instance serve each
// user their number of paid reads, each of another image; it returns the
// keys.
func serveReads(t *testing.T, config string, env map[string]string, reads map[string]int) map[string]string {
	t.Helper()
	keys := map[string]string{}
	for user := range reads {
		out, err := cliRun(config, env, "keys", "create", "--user", user, "--plan", "free")
		if err != nil {
			t.Fatalf("keys create: %v\n%s", err, out)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		keys[user] = lines[len(lines)-1]
	}
	serveReadsWith(t, config, env, keys, reads)
	return keys
}

// seed numbers the images of serveReadsWith, so that no read is answered
// from another's as the same image (the tests on a cluster of their own
// run at once).
var seed atomic.Uint32

// serveReadsWith starts an instance, has it serve each user's reads with
// their key, and stops it.
func serveReadsWith(t *testing.T, config string, env, keys map[string]string, reads map[string]int) {
	t.Helper()
	a, _, stop := startApp(t, config, envFrom(env))
	defer stop()
	for user, n := range reads {
		for range n {
			if status, body, err := postImage(a.Addr(), keys[user], labelPNG(t, uint8(seed.Add(1)))); err != nil || status != http.StatusOK {
				t.Fatalf("a read of %s's: %d %s %v", user, status, body, err)
			}
		}
	}
}

// figures are the operator's figures of the database in env: every
// user's usage and the budget, as --json prints them.
func figures(t *testing.T, config string, env map[string]string) string {
	t.Helper()
	usage, err := cliRun(config, env, "usage", "--json")
	if err != nil {
		t.Fatalf("usage: %v\n%s", err, usage)
	}
	budget, err := cliRun(config, env, "budget", "--json")
	if err != nil {
		t.Fatalf("budget: %v\n%s", err, budget)
	}
	return usage + budget
}

// checkDatedPostgresBackup: backup --dir on PostgreSQL names its copy
// .sql, and --keep counts those alone.
func checkDatedPostgresBackup(t *testing.T, config string, env map[string]string) {
	t.Helper()
	dir := t.TempDir()
	other := filepath.Join(dir, "breakwater-2020-01-01T0000Z.db") // a bolt copy: not this kind
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if out, err := cliRun(config, env, "backup", "--dir", dir, "--keep", "1"); err != nil {
			t.Fatalf("backup --dir: %v\n%s", err, out)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 || names[0] != filepath.Base(other) || !strings.HasSuffix(names[1], ".sql") {
		t.Errorf("backup --dir --keep 1 on PostgreSQL left %v, want the bolt copy and one .sql copy", names)
	}
}
