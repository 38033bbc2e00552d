package cli_test

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"breakwater/server/cli"
)

// users ban refuses an id that names no user (a typo must not ban a
// phantom) unless --create, which is how a sign-in user who has not called
// yet is banned; the same with the server stopped and through its admin
// API.
func TestUsersBanUnknownID(t *testing.T) {
	for _, serving := range []bool{false, true} {
		t.Run(fmt.Sprintf("serving=%v", serving), func(t *testing.T) {
			dir := t.TempDir()
			path := operatorConfig(t, freeAddr(t), filepath.Join(dir, "bw.db"), "")
			env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "users-test-token"})
			cmd := cliOn(path, env)
			if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
				t.Fatal(err)
			}
			if serving {
				startApp(t, path, env)
			}
			for _, args := range [][]string{{"users", "ban", "ghost"}, {"users", "unban", "ghost"}, {"users", "ban", "jwt:user_2abc"}} {
				_, err := cmd(args...)
				if err == nil || !strings.Contains(err.Error(), "no user has that id") || cli.ExitCode(err, io.Discard) != 1 {
					t.Errorf("%v: %v, want exit 1 and \"no user has that id\"", args, err)
				}
			}
			if out, err := cmd("users", "ban", "ann"); err != nil || !strings.Contains(out, "user ann: banned=true") {
				t.Errorf("ban ann: %q %v", out, err)
			}
			if out, err := cmd("users", "ban", "--create", "jwt:user_2abc"); err != nil || !strings.Contains(out, "user jwt:user_2abc: banned=true") {
				t.Errorf("ban --create jwt:user_2abc: %q %v", out, err)
			}
			if out, err := cmd("users", "unban", "jwt:user_2abc"); err != nil || !strings.Contains(out, "banned=false") {
				t.Errorf("unban jwt:user_2abc once it exists: %q %v", out, err)
			}
			out, err := cmd("usage")
			if err != nil || strings.Contains(out, "ghost") {
				t.Errorf("usage lists a phantom user: %q %v", out, err)
			}
		})
	}
}

// A wrong admin token names the server that refused it, not a generic
// hint, for every kind of call (a JSON one and the backup stream).
func TestWrongAdminTokenNamesTheServer(t *testing.T) {
	adminAddr := freeAddr(t)
	path := operatorConfig(t, adminAddr, filepath.Join(t.TempDir(), "bw.db"), "")
	startApp(t, path, envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "the-right-token"}))
	wrong := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "a-wrong-token"})
	want := "your BREAKWATER_ADMIN_TOKEN was refused by the server at " + adminAddr
	for _, args := range [][]string{{"keys", "list"}, {"brake", "on"}, {"backup", filepath.Join(t.TempDir(), "copy.db")}} {
		err := run(context.Background(), append(args, "--config", path), wrong, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v with a wrong token: %v, want %q", args, err, want)
		}
	}
}
