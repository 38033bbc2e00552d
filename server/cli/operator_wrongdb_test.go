package cli_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// Two instances on one machine, and a CLI config that names the first's
// database with the second's admin address: the CLI finds the first's
// database locked, reaches the second, and must refuse rather than print
// the second's keys or copy its database.
func TestCLIRefusesAServerWithAnotherDatabase(t *testing.T) {
	dir := t.TempDir()
	dbA, dbB := filepath.Join(dir, "a", "bw.db"), filepath.Join(dir, "b", "bw.db")
	config := func(db, admin string) string { return operatorConfig(t, admin, db, "") }
	// The servers take free ports; the CLI's configs then name them.
	pathA, pathB := config(dbA, "127.0.0.1:0"), config(dbB, "127.0.0.1:0")
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "one-token-for-both-instances"})
	cmd := func(path string, args ...string) (string, error) { return cliOn(path, env)(args...) }
	for path, user := range map[string]string{pathA: "ann", pathB: "bob"} {
		if _, err := cmd(path, "keys", "create", "--user", user); err != nil {
			t.Fatal(err)
		}
	}
	appA, _, _ := startApp(t, pathA, env)
	appB, _, _ := startApp(t, pathB, env)
	adminB := appB.AdminAddr()
	pathA, pathB = config(dbA, appA.AdminAddr()), config(dbB, adminB)
	mixed := config(dbA, adminB)

	// Each config reaches its own server.
	if out, err := cmd(pathA, "keys", "list"); err != nil || !strings.Contains(out, "ann") || strings.Contains(out, "bob") {
		t.Errorf("keys list of A: %q %v", out, err)
	}
	if out, err := cmd(pathB, "keys", "list"); err != nil || !strings.Contains(out, "bob") {
		t.Errorf("keys list of B: %q %v", out, err)
	}
	want := fmt.Sprintf("the server at %s holds %s, not %s: check server.admin_listen and storage.path", adminB, dbB, dbA)
	for _, args := range [][]string{{"keys", "list"}, {"brake", "on"}, {"backup", filepath.Join(dir, "copy.db")}} {
		out, err := cmd(mixed, args...)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v with the mixed config: %v, want %q", args, err, want)
		}
		if strings.Contains(out, "bob") {
			t.Errorf("%v with the mixed config printed the other server's data: %q", args, out)
		}
	}
	if out, _ := cmd(pathB, "budget"); strings.Contains(out, "ENGAGED") {
		t.Error("the mixed config's brake on reached the other server")
	}
}
