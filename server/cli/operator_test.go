package cli_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A relative storage.path is taken from the config file's folder, not from
// where the command runs; and an operator command never makes an empty
// database where it found none (the review's `keys list` from another
// folder printed an empty table from a new file).
func TestRelativeStoragePathAndNoNewDatabase(t *testing.T) {
	root := t.TempDir()
	bw := filepath.Join(root, "bw")
	elsewhere := filepath.Join(root, "elsewhere")
	for _, d := range []string{bw, elsewhere} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bw, "config.toml"), []byte("[storage]\npath = \"data/bw.db\"\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(args, "--config", "../bw/config.toml"), envFrom(nil), &out, io.Discard)
		return out.String(), err
	}
	t.Chdir(elsewhere)

	_, err := cmd("keys", "list")
	if err == nil || !strings.Contains(err.Error(), "no database at "+filepath.Join(bw, "data", "bw.db")) {
		t.Errorf("keys list with no database: %v, want a refusal naming the path", err)
	}
	for _, d := range []string{filepath.Join(bw, "data"), filepath.Join(elsewhere, "data")} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s was created by a command that found no database", d)
		}
	}

	if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bw, "data", "bw.db")); err != nil {
		t.Errorf("keys create did not make the database beside the config: %v", err)
	}
	out, err := cmd("keys", "list")
	if err != nil || !strings.Contains(out, "ann") {
		t.Errorf("keys list from another folder: %q %v, want ann's key", out, err)
	}
}
