package cli_test

import (
	"bytes"
	"context"
	"fmt"
	neturl "net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

// config check says whether the server it reaches has a synchronous
// standby, which a failover must be to lose no commit: a warning for a
// server without one (alone, or with an asynchronous standby), the
// synchronous standby streaming when there is one, a warning when
// synchronous_standby_names names one that is not connected (every
// commit waits), an honest "not known" for a role that may not read
// pg_stat_replication's state, and a refusal of a URL that reaches the
// standby itself, as serve's.
func TestConfigCheckSaysWhetherThereIsASynchronousStandby(t *testing.T) {
	t.Parallel() // a cluster of its own: its start is mostly waiting
	cfg := writeConfig(t, instancesTOML(t)+"[ocr]\nprovider = \"simulated\"\n[plans.free]\nmonthly_quota = 100\n")
	check := func(url string) string {
		t.Helper()
		var out, errOut bytes.Buffer
		err := run(context.Background(), []string{"config", "check", "--config", cfg},
			envFrom(map[string]string{"BREAKWATER_SECRET": migrateSecret, postgres.EnvURL: url}), &out, &errOut)
		if err != nil {
			t.Fatalf("config check on %s: %v\n%s%s", url, err, out.String(), errOut.String())
		}
		return out.String() + errOut.String()
	}
	expect := func(what, out string, want, unwanted []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: no %q in\n%s", what, w, out)
			}
		}
		for _, u := range unwanted {
			if strings.Contains(out, u) {
				t.Errorf("%s: %q in\n%s", what, u, out)
			}
		}
	}
	const none = "warning: the server has no synchronous standby"

	expect("a server alone", check(pgtest.NewDatabase(t)), []string{none + " (synchronous_standby_names is empty)"}, nil)

	async := pgtest.NewReplicated(t, false)
	expect("an asynchronous standby", check(async.CreateDatabase(t, "bw")), []string{none + " (1 asynchronous standby streaming)"}, nil)

	r := pgtest.NewReplicated(t, true)
	url := r.CreateDatabase(t, "bw")
	expect("a synchronous standby", check(url),
		[]string{fmt.Sprintf("storage: 1 synchronous standby streaming (synchronous_standby_names = %q)", pgtest.StandbyName)}, []string{none})
	if err := r.CaughtUp(10 * time.Second); err != nil { // the database made on the standby too
		t.Fatal(err)
	}
	// The standby itself: serve would refuse it (no writes), and so does
	// config check, saying what to connect to.
	var out bytes.Buffer
	err := run(context.Background(), []string{"config", "check", "--config", cfg},
		envFrom(map[string]string{"BREAKWATER_SECRET": migrateSecret, postgres.EnvURL: r.Standby.URL("bw")}), &out, &out)
	if err == nil || !strings.Contains(err.Error(), "the server is a standby (read-only)") || !strings.Contains(err.Error(), "target_session_attrs=read-write") {
		t.Errorf("config check on the standby: %v, want a refusal naming the standby and the multi-host URL\n%s", err, out.String())
	}

	// A role that is no superuser sees a standby's row, not its state.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE ROLE bw_plain LOGIN; GRANT CREATE ON SCHEMA public TO bw_plain"); err != nil {
		t.Fatal(err)
	}
	plain, err := neturl.Parse(url)
	if err != nil {
		t.Fatal(err)
	}
	plain.User = neturl.User("bw_plain")
	expect("a role without pg_read_all_stats", check(plain.String()),
		[]string{"may not read the standbys' state", "whether a synchronous standby is connected is not known"}, []string{none, "storage: 1 synchronous"})

	// The standby gone: commits would wait for it.
	r.Standby.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication").Scan(&n); err != nil || n == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	expect("a synchronous standby named and gone", check(url), []string{"but no synchronous standby is connected: every commit waits"}, []string{none})
}
