package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// An operator lists the invite cooldowns and lifts one for a legitimate
// user: through the admin API while serving, and on the database (the
// written-behind state) while stopped.
func TestCooldownsListAndClear(t *testing.T) {
	dir := t.TempDir()
	path := writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = %q\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n[invites]\nfail_limit = 2\n[plans.free]\nmonthly_quota = 10\n",
		freeAddr(t), filepath.Join(dir, "bw.db")))
	env := envFrom(map[string]string{"BREAKWATER_ADMIN_TOKEN": "cooldowns-test-token"})
	cmd := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(args, "--config", path), env, &out, io.Discard)
		return out.String(), err
	}
	if _, err := cmd("keys", "create", "--user", "ann"); err != nil {
		t.Fatal(err)
	}
	a, _, stop := startApp(t, path, env)
	code, err := cmd("invites", "create", "--uses", "5")
	if err != nil {
		t.Fatal(err)
	}
	code = strings.TrimSpace(code[strings.LastIndex(strings.TrimSpace(code), "\n")+1:])
	verify := func(code, email string) int {
		t.Helper()
		resp, err := http.Post("http://"+a.Addr()+"/v1/invites/verify", "application/json", strings.NewReader(fmt.Sprintf(`{"code":%q,"email":%q}`, code, email)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 2 {
		verify("2222-2222-2222", "ann@example.com")
	}
	if got := verify(code, "ann@example.com"); got != http.StatusForbidden {
		t.Fatalf("the right code during the cooldown: %d, want 403", got)
	}
	out, err := cmd("cooldowns", "list")
	if err != nil || !strings.Contains(out, "email:ann@example.com") || !strings.Contains(out, "ip:127.0.0.1") {
		t.Fatalf("cooldowns list while serving: %v\n%s", err, out)
	}
	if out, err := cmd("cooldowns", "clear", "email:ann@example.com"); err != nil || !strings.Contains(out, "lifted") {
		t.Fatalf("cooldowns clear: %q %v", out, err)
	}
	if _, err := cmd("cooldowns", "clear", "email:nobody@example.com"); err == nil || !strings.Contains(err.Error(), "no cooldown is on") {
		t.Errorf("clear of a key in no cooldown: %v", err)
	}
	if out, _ := cmd("cooldowns", "list"); strings.Contains(out, "email:ann@example.com") {
		t.Errorf("cleared key still listed:\n%s", out)
	}

	// Stopped: the IP's cooldown was written behind, and is lifted on the
	// database so that the next start does not bring it back.
	stop()
	out, err = cmd("cooldowns", "list", "--json")
	if err != nil || !strings.Contains(out, `"key": "ip:127.0.0.1"`) || strings.Contains(out, "email:ann") {
		t.Fatalf("cooldowns list stopped: %v\n%s", err, out)
	}
	if _, err := cmd("cooldowns", "clear", "ip:127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	a, _, _ = startApp(t, path, env)
	if got := verify(code, "ann@example.com"); got != http.StatusOK {
		t.Errorf("the right code after both cooldowns were lifted: %d, want 200", got)
	}
}
