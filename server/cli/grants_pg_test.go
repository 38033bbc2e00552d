package cli_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// instancesSnippet returns the fenced block after `<!-- snippet: name -->`
// in docs/INSTANCES.md: what users copy, run as written.
func instancesSnippet(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("docs/INSTANCES.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- snippet: " + regexp.QuoteMeta(name) + " -->\n```[a-z]*\n(.*?)```").FindSubmatch(b)
	if m == nil {
		t.Fatalf("docs/INSTANCES.md has no snippet %q", name)
	}
	return string(m[1])
}

// execAs runs sql (one statement or several) on url.
func execAs(t *testing.T, url, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// serveRefusal runs serve, which must refuse to start, and returns its
// error.
func serveRefusal(t *testing.T, config string, env map[string]string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, []string{"serve", "--config", config}, envFrom(env), io.Discard, io.Discard) }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Fatal("serve started (or hung) where it should have refused")
		return nil
	}
}

// The documented grants, run as written, make a role that serves paid
// reads on a schema the owner made, and that config check passes; a role
// that lacks one of them is refused by config check and by serve, each
// naming what is missing and the GRANT that gives it. Without a current
// schema, a role without CREATE is refused alike. Before, serve ran
// CREATE TABLE IF NOT EXISTS at every start and refused such a role
// ("permission denied for schema public") that config check had passed.
func TestMinimalGrantsAsDocumented(t *testing.T) {
	t.Parallel() // a cluster of its own: its start is mostly waiting
	c := pgtest.NewCluster(t)
	super := c.URL("postgres")
	execAs(t, super, "CREATE ROLE breakwater LOGIN")
	execAs(t, super, "CREATE DATABASE breakwater OWNER breakwater")
	dbURL := func(role string) string {
		return fmt.Sprintf("postgres://%s@127.0.0.1:%d/breakwater?sslmode=disable", role, c.Port())
	}
	superDB := dbURL("postgres")
	execAs(t, superDB, instancesSnippet(t, "app-role-grants")) // before the schema: the default privileges give the rights
	config := writeConfig(t, instancesTOML(t)+`
[server]
listen = "127.0.0.1:0"
[ocr]
provider = "simulated"
[plans.free]
monthly_quota = 100
`)
	owner := map[string]string{postgres.EnvURL: dbURL("breakwater"), "BREAKWATER_SECRET": migrateSecret}
	app := map[string]string{postgres.EnvURL: dbURL("breakwater_app"), "BREAKWATER_SECRET": migrateSecret}

	// No schema yet: the app role may not make it.
	out, err := cliRun(config, app, "config", "check")
	if err == nil || !strings.Contains(err.Error(), "GRANT CREATE ON SCHEMA public TO breakwater_app") {
		t.Errorf("config check of the app role on an empty database: %v\n%s", err, out)
	}
	if err := serveRefusal(t, config, app); err == nil || !strings.Contains(err.Error(), "GRANT CREATE ON SCHEMA public TO breakwater_app") ||
		!strings.Contains(err.Error(), "owner's URL") {
		t.Errorf("serve of the app role on an empty database: %v", err)
	}

	// The owner makes the schema (and a key).
	out, err = cliRun(config, owner, "keys", "create", "--user", "alice", "--plan", "free")
	if err != nil {
		t.Fatalf("keys create as the owner: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	keys := map[string]string{"alice": lines[len(lines)-1]}

	if out, err := cliRun(config, app, "config", "check"); err != nil {
		t.Fatalf("config check of the documented app role: %v\n%s", err, out)
	}
	serveReadsWith(t, config, app, keys, map[string]int{"alice": 2})

	for _, tc := range []struct {
		revoke, lacks, grant string
	}{
		{"REVOKE UPDATE ON money_owners FROM breakwater_app", "UPDATE on table money_owners",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO breakwater_app"},
		{"REVOKE INSERT ON usage_rows FROM breakwater_app", "INSERT on table usage_rows",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO breakwater_app"},
		{"REVOKE DELETE ON quota_holds FROM breakwater_app", "DELETE on table quota_holds",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO breakwater_app"},
		{"REVOKE SELECT ON breakwater_schema FROM breakwater_app", "SELECT on table breakwater_schema",
			"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO breakwater_app"},
		{"REVOKE USAGE ON SEQUENCE usage_rows_id_seq FROM breakwater_app", "USAGE on sequence usage_rows_id_seq",
			"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO breakwater_app"},
		{"REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM PUBLIC, breakwater_app", "EXECUTE on function bw_",
			"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO breakwater_app"},
		{"REVOKE USAGE ON SCHEMA public FROM PUBLIC, breakwater_app", "USAGE on schema public",
			"GRANT USAGE ON SCHEMA public TO breakwater_app"},
		{"REVOKE CONNECT ON DATABASE breakwater FROM PUBLIC, breakwater_app", "permission denied for database",
			"GRANT CONNECT ON DATABASE breakwater TO breakwater_app"},
	} {
		t.Run(tc.lacks, func(t *testing.T) {
			execAs(t, superDB, tc.revoke)
			defer execAs(t, superDB, tc.grant)
			out, err := cliRun(config, app, "config", "check")
			if err == nil || !strings.Contains(err.Error(), tc.lacks) || !strings.Contains(err.Error(), tc.grant) {
				t.Errorf("config check: %v\n%s\nwant it refused, naming %q and %q", err, out, tc.lacks, tc.grant)
			}
			if err := serveRefusal(t, config, app); err == nil || !strings.Contains(err.Error(), tc.lacks) || !strings.Contains(err.Error(), tc.grant) {
				t.Errorf("serve: %v\nwant it refused, naming %q and %q", err, tc.lacks, tc.grant)
			}
		})
	}
	// Every right given back, the role serves again.
	if out, err := cliRun(config, app, "config", "check"); err != nil {
		t.Fatalf("config check once the rights are back: %v\n%s", err, out)
	}
	serveReadsWith(t, config, app, keys, map[string]int{"alice": 1})
}
