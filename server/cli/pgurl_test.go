package cli_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"breakwater/storage/postgres"
)

// A password left raw in BREAKWATER_POSTGRES_URL (here with a / and an @,
// which Go's URL parser would otherwise split into a host and a database
// name) stops config check and serve with the advice to percent-encode
// it, and neither prints any part of it, in its error or its output.
func TestRawPasswordInURL(t *testing.T) {
	const password = "Qz7k/Wm4x@Jp2v"
	url := "postgres://breakwater:" + password + "@127.0.0.1:5432/breakwater?sslmode=disable"
	cfg := writeConfig(t, "[storage]\nbackend = \"postgres\"\n[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	env := envFrom(map[string]string{postgres.EnvURL: url, "BREAKWATER_SECRET": migrateSecret, "GEMINI_API_KEY": "test-key"})
	for _, args := range [][]string{{"config", "check", "--config", cfg}, {"serve", "--config", cfg}} {
		t.Run(args[0], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var out, errOut bytes.Buffer
			err := run(ctx, args, env, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), "percent-encoded") {
				t.Fatalf("%s: %v, want the advice to percent-encode the password\n%s%s", args[0], err, out.String(), errOut.String())
			}
			all := err.Error() + out.String() + errOut.String()
			for _, part := range strings.FieldsFunc(password, func(r rune) bool { return r == '/' || r == '@' }) {
				if strings.Contains(all, part) {
					t.Errorf("%s shows %q of the password:\n%s", args[0], part, all)
				}
			}
		})
	}
}
