package postgres_test

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// rawPasswords are passwords that a URL cannot hold as they are; the
// cluster the tests use trusts every connection, so the password's value
// does not matter, only how the URL holds it.
// Each piece between the reserved characters is one a message would not
// hold by chance.
var rawPasswords = []string{"Qz7/Wk4@Jm2", "1234/5678", "Vb3#Xr8", "Hq5?Tz1", "Lw6 Pk9", "Zt4%zzYn7", "Fj2@Rm5/Cx8:Dn1"}

// A password left raw in the URL is refused by Open and Probe with a
// message that says to percent-encode it and quotes no part of it (nor of
// the URL); the same password percent-encoded connects.
func TestRawPasswordSaysToPercentEncode(t *testing.T) {
	t.Parallel()
	base, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	user := base.User.Username()
	for _, pw := range rawPasswords {
		raw := strings.Replace(base.String(), "://"+user+"@", "://"+user+":"+pw+"@", 1)
		if raw == base.String() {
			t.Fatalf("no user in the test server's URL to add a password to")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		db, openErr := postgres.Open(ctx, raw, postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		if openErr == nil {
			db.Close()
		}
		_, probeErr := postgres.Probe(ctx, raw)
		cancel()
		for what, err := range map[string]error{"Open": openErr, "Probe": probeErr} {
			if err == nil || !strings.Contains(err.Error(), "percent-encoded") || !strings.Contains(err.Error(), postgres.EnvURL) {
				t.Errorf("%s with the password %q raw: %v, want the advice to percent-encode it", what, pw, err)
				continue
			}
			if leak := passwordPart(err.Error(), pw); leak != "" {
				t.Errorf("%s with the password %q raw: the message shows %q of it: %v", what, pw, leak, err)
			}
		}
		encoded := *base
		encoded.User = url.UserPassword(user, pw)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		db, err := postgres.Open(ctx, encoded.String(), postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		cancel()
		if err != nil {
			t.Errorf("the password %q percent-encoded: %v", pw, err)
			continue
		}
		db.Close()
	}
}

// passwordPart returns a piece of pw, between its reserved characters,
// that msg shows.
func passwordPart(msg, pw string) string {
	for _, part := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@/#?[] %:", r) }) {
		if strings.Contains(msg, part) {
			return part
		}
	}
	return ""
}

// The message does not depend on the URL: a test of it without a server.
func TestBadURLMessageQuotesNothing(t *testing.T) {
	t.Parallel()
	_, err := postgres.Open(context.Background(), "postgres://u:s3cr#t@host/db", postgres.Options{})
	if err == nil || errors.Is(err, postgres.ErrNoURL) || strings.Contains(err.Error(), "s3cr") || strings.Contains(err.Error(), "host/db") {
		t.Fatalf("Open: %v", err)
	}
}

// A URL without connect_timeout gets DefaultConnectTimeout on every
// connection of the pool, so that an attempt to open one while the
// database's packets are dropped gives its place in the pool up (the
// network namespace test, test/netcut, cuts a link and measures the
// return); one with connect_timeout keeps its own.
func TestConnectTimeoutDefault(t *testing.T) {
	t.Parallel()
	base := pgtest.NewDatabase(t)
	for _, tc := range []struct {
		query string
		want  time.Duration
	}{
		{"", postgres.DefaultConnectTimeout},
		{"connect_timeout=7", 7 * time.Second},
	} {
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if tc.query != "" {
			kv := strings.SplitN(tc.query, "=", 2)
			q.Set(kv[0], kv[1])
		}
		u.RawQuery = q.Encode()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		db, err := postgres.Open(ctx, u.String(), postgres.Options{Logger: slog.New(slog.DiscardHandler)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got := db.Pool().Config().ConnConfig.ConnectTimeout; got != tc.want {
			t.Errorf("URL options %q: a connection's opening is bounded by %v, want %v", tc.query, got, tc.want)
		}
		db.Close()
	}
}
