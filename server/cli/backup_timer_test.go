package cli_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeUnit is the ini block of docs/OPERATIONS.md that starts with the comment
// "# /etc/systemd/system/NAME", up to the next such comment or the end
// of the block.
func readmeUnit(t *testing.T, name string) string {
	t.Helper()
	readme, err := os.ReadFile("docs/OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	head := "# /etc/systemd/system/" + name + "\n"
	_, rest, ok := strings.Cut(string(readme), head)
	if !ok {
		t.Fatalf("docs/OPERATIONS.md has no unit %s", name)
	}
	rest, _, _ = strings.Cut(rest, "```")
	if i := strings.Index(rest, "# /etc/systemd/system/"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

var datedBackupRE = regexp.MustCompile(`^breakwater-\d{4}-\d{2}-\d{2}T\d{4}Z\.db$`)

// The README's backup timer works as written: its ExecStart is a command
// line breakwater takes, with no % for systemd to expand; it writes a
// dated copy into a folder it makes (0700), keeps --keep of its own
// copies and touches no other file. systemd-analyze verifies the units
// when it is installed.
func TestBackupTimerAsWritten(t *testing.T) {
	args, line := backupExecStart(t)
	// Run it as written, with the test's config and folder in place of
	// /etc/breakwater and /var/lib.
	dir := t.TempDir()
	config := writeConfig(t, fmt.Sprintf("[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n", filepath.Join(dir, "bw.db")))
	backups := filepath.Join(dir, "var-lib", "breakwater-backups")
	for i, a := range args {
		switch {
		case a == "/etc/breakwater/config.toml":
			args[i] = config
		case strings.HasPrefix(a, "/var/lib/"):
			args[i] = filepath.Join(dir, "var-lib", strings.TrimPrefix(a, "/var/lib/"))
		}
	}
	if err := run(context.Background(), []string{"keys", "create", "--user", "ann", "--config", config}, envFrom(nil), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	keep := 0
	if i := slices.Index(args, "--keep"); i >= 0 && i+1 < len(args) {
		fmt.Sscan(args[i+1], &keep)
	}
	if keep < 1 {
		t.Fatalf("ExecStart %q keeps every copy: the folder would grow without end", line)
	}
	checkBackupKeepsItsOwn(t, args, backups, keep)
	checkBackupMakesItsFolder(t, dir, config)
	verifyBackupUnits(t)
}

// backupExecStart reads the README's backup service: its ExecStart,
// which runs breakwater backup into the unit's StateDirectory with no %
// for systemd to expand. It returns breakwater's arguments and the line.
func backupExecStart(t *testing.T) (args []string, line string) {
	service := readmeUnit(t, "breakwater-backup.service")
	m := regexp.MustCompile(`(?m)^ExecStart=(.*)$`).FindStringSubmatch(service)
	if m == nil {
		t.Fatalf("the backup service has no ExecStart:\n%s", service)
	}
	if strings.Contains(m[1], "%") {
		t.Errorf("ExecStart %q holds a %% that systemd would expand", m[1])
	}
	args = strings.Fields(m[1])
	if args[0] != "/usr/local/bin/breakwater" || args[1] != "backup" {
		t.Fatalf("ExecStart %q does not run breakwater backup", m[1])
	}
	args = args[1:]
	state := regexp.MustCompile(`(?m)^StateDirectory=(\S+)$`).FindStringSubmatch(service)
	if state == nil || !slices.Contains(args, "/var/lib/"+state[1]) {
		t.Errorf("ExecStart %q does not write into the unit's StateDirectory %v", m[1], state)
	}
	return args, m[1]
}

// checkBackupKeepsItsOwn runs breakwater with args, a backup into
// backups that keeps keep copies, beside earlier dated copies and files
// it did not write: it keeps the new copy and the newest before it, and
// touches nothing else.
func checkBackupKeepsItsOwn(t *testing.T, args []string, backups string, keep int) {
	// Earlier dated copies, more than --keep, oldest first, and files
	// the command did not write.
	if err := os.MkdirAll(backups, 0o700); err != nil {
		t.Fatal(err)
	}
	var old []string
	for i := range keep + 3 {
		old = append(old, fmt.Sprintf("breakwater-2025-%02d-%02dT0315Z.db", 1+i/28, 1+i%28))
	}
	foreign := []string{"breakwater-notes.db", "breakwater-2026-01-01T0315Z.db.bak", "other.db", "breakwater-2026-01-01.db"}
	for _, name := range append(slices.Clone(old), foreign...) {
		if err := os.WriteFile(filepath.Join(backups, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := run(context.Background(), args, envFrom(nil), io.Discard, io.Discard); err != nil {
		t.Fatalf("breakwater %s: %v", strings.Join(args, " "), err)
	}
	entries, err := os.ReadDir(backups)
	if err != nil {
		t.Fatal(err)
	}
	var dated, rest []string
	for _, e := range entries {
		if datedBackupRE.MatchString(e.Name()) {
			dated = append(dated, e.Name())
		} else {
			rest = append(rest, e.Name())
		}
	}
	slices.Sort(foreign)
	if !slices.Equal(rest, foreign) {
		t.Errorf("files beside the copies %v, want the ones it did not write untouched: %v", rest, foreign)
	}
	if len(dated) != keep {
		t.Fatalf("%d dated copies %v, want --keep %d", len(dated), dated, keep)
	}
	newest := dated[len(dated)-1]
	if want := append(slices.Clone(old[len(old)-(keep-1):]), newest); slices.Contains(old, newest) || !slices.Equal(dated, want) {
		t.Errorf("kept %v, want the new copy and the newest %d before it: %v", dated, keep-1, want)
	}
	if fi, err := os.Stat(filepath.Join(backups, newest)); err != nil || fi.Size() < 4096 {
		t.Errorf("the new copy: %v %v", fi, err)
	}
}

// checkBackupMakesItsFolder: a folder that is not there is made, 0700.
func checkBackupMakesItsFolder(t *testing.T, dir, config string) {
	// A folder that is not there is made, 0700.
	fresh := filepath.Join(dir, "fresh", "backups")
	if err := run(context.Background(), []string{"backup", "--config", config, "--dir", fresh}, envFrom(nil), io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the folder made: %v %v, want mode 0700", fi, err)
	}
	if entries, _ := os.ReadDir(fresh); len(entries) != 1 || !datedBackupRE.MatchString(entries[0].Name()) {
		t.Errorf("the fresh folder holds %v, want one dated copy", entries)
	}
}

// verifyBackupUnits runs systemd's own check of both units, when the tool
// is there.
func verifyBackupUnits(t *testing.T) {
	// systemd's own check of both units, when the tool is there.
	tool, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the units were not verified by systemd (the command they run was)")
		return
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	units := t.TempDir()
	for _, name := range []string{"breakwater-backup.service", "breakwater-backup.timer"} {
		body := strings.ReplaceAll(readmeUnit(t, name), "/usr/local/bin/breakwater", self)
		if err := os.WriteFile(filepath.Join(units, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(tool, "verify", filepath.Join(units, "breakwater-backup.service"), filepath.Join(units, "breakwater-backup.timer"))
	out, err := cmd.CombinedOutput()
	// verify only warns of an unknown key or a bad value: any word about
	// these units is a failure.
	if err != nil || strings.Contains(string(out), "breakwater-backup") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
