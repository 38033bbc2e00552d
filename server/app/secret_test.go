package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage"
)

// verifyInvite posts code and email to the running app and returns the
// status.
func verifyInvite(t *testing.T, a *App, code, email string) int {
	t.Helper()
	body := fmt.Sprintf(`{"code":%q,"email":%q}`, code, email)
	resp, err := http.Post("http://"+a.Addr()+"/v1/invites/verify", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Invite codes are stored under an HMAC keyed with the server secret:
// a code made after the change is not findable by its plain SHA-256; a
// code stored before (under its SHA-256) is re-keyed at the first start
// and still verifies, with its redemptions; the secret is a 0600 file
// beside the database, made once and reused.
func TestInviteCodesAreKeyedWithTheServerSecret(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "data", "bw.db")

	// A database from before the key: one invite under its SHA-256, with
	// one redemption.
	legacy := "7KQM-X3HD-9RWN"
	digest := invites.Digest(invites.NormaliseCode(legacy))
	db, err := storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if err := db.CreateInvite(invites.Invite{ID: "inv_legacy", Hash: digest, MaxUses: 2, CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), digest, "early@example.com", now); err != nil {
		t.Fatal(err)
	}
	db.Close()

	cfg, err := Load(writeConfig(t, fmt.Sprintf("[server]\nlisten = \"127.0.0.1:0\"\n[storage]\npath = %q\n[ocr]\nprovider = \"simulated\"\n"+minimal, dbPath)), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	open := func() *App {
		t.Helper()
		a, err := Open(context.Background(), cfg, Options{Getenv: env(nil)})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a := open()
	secretPath := filepath.Join(dir, "data", SecretFile)
	fi, err := os.Stat(secretPath)
	if err != nil {
		t.Fatalf("no secret file beside the database: %v", err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("secret file mode %v, want 0600", got)
	}
	first, _ := os.ReadFile(secretPath)
	if got := verifyInvite(t, a, legacy, "late@example.com"); got != http.StatusOK {
		t.Errorf("the code stored before the key: verify = %d, want 200", got)
	}
	fresh, _, err := a.Invites().Create(1, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	a.Close()

	// The secret is reused: both codes still verify after a restart.
	a = open()
	if again, _ := os.ReadFile(secretPath); !bytes.Equal(again, first) {
		t.Errorf("the secret changed at restart: %q, then %q", first, again)
	}
	if got := verifyInvite(t, a, legacy, "late@example.com"); got != http.StatusOK {
		t.Errorf("the legacy code after a restart: verify = %d, want 200 (already redeemed by this e-mail)", got)
	}
	if got := verifyInvite(t, a, fresh, "new@example.com"); got != http.StatusOK {
		t.Errorf("a code made after the key: verify = %d, want 200", got)
	}
	a.Close()

	db, err = storage.Open(dbPath, storage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, code := range []string{legacy, fresh} {
		if _, err := db.InviteByHash(invites.Digest(invites.NormaliseCode(code))); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("code %s is findable by its plain SHA-256: %v", code, err)
		}
	}
	key, err := invites.NewKey(bytes.TrimSpace(first))
	if err != nil {
		t.Fatal(err)
	}
	red, err := db.Redemptions(key.Hash(invites.NormaliseCode(legacy)))
	if err != nil || len(red) != 2 || red[0].Email != "early@example.com" {
		t.Errorf("the legacy code's redemptions after re-keying: %v %v, want early@ and late@", red, err)
	}
}

// BREAKWATER_SECRET, when set, is the secret: no file is made; one too
// short is refused.
func TestServerSecretFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "bw.db")
	got, err := serverSecret(dbPath, env(map[string]string{"BREAKWATER_SECRET": "0123456789abcdef-env"}), nil)
	if err != nil || string(got) != "0123456789abcdef-env" {
		t.Errorf("serverSecret = %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(dir, SecretFile)); !os.IsNotExist(err) {
		t.Errorf("a secret file was made although BREAKWATER_SECRET is set: %v", err)
	}
	if _, err := serverSecret(dbPath, env(map[string]string{"BREAKWATER_SECRET": "short"}), nil); !errors.Is(err, invites.ErrShortSecret) {
		t.Errorf("a short BREAKWATER_SECRET: %v, want ErrShortSecret", err)
	}
}
