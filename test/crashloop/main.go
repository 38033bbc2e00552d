// Command crashloop proves that Breakwater keeps its money promises across
// crashes. It builds the real binary with -tags failpoint, runs it against
// a fake Gemini (the real client path, every call counted), drives
// concurrent load from several users and keys, and kills the server with
// SIGKILL: at random moments, and exactly between the budget reservation's
// commit and the upstream call ("reserved") or between the usage record's
// commit and the answer ("recorded"). After each kill it checks, with the
// server stopped, that every 200 a client received has its usage row, that
// the quota counts are exactly the usage rows and at least the 200s, that
// upstream calls never exceed daily_requests, that the ledger counts every
// call that reached the fake (no reservation lost), and that the database
// passes bbolt's consistency check. Then it restarts the server on the same
// database.
//
// With -powercut (root, Linux, a loop device) the database lives on ext4 on
// a loop device, and each kill is followed by a power cut: the image the
// device had received at the kill, without the page cache, is what the next
// round boots from. That tests the fsync path, which SIGKILL alone does not.
//
// Everything listens on 127.0.0.1; every round is bounded in time and the
// whole run by -timeout. Exit status 1 on any violation.
//
// With -backend postgres the server runs on the PostgreSQL database that
// BREAKWATER_POSTGRES_URL names (a fresh one: the loop checks every row in
// it), and the checks read it there.
//
//	go run ./test/crashloop -rounds 50
//	go run ./test/crashloop -rounds 20 -powercut
//	BREAKWATER_POSTGRES_URL=postgres://... go run ./test/crashloop -backend postgres
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	var o Options
	flag.IntVar(&o.Rounds, "rounds", 50, "rounds: start, load, kill, check")
	flag.IntVar(&o.Users, "users", 3, "users, each with -keys API keys")
	flag.IntVar(&o.KeysPerUser, "keys", 2, "API keys per user")
	flag.IntVar(&o.Workers, "workers", 8, "concurrent clients")
	flag.Int64Var(&o.DailyRequests, "daily-requests", 0, "budget.daily_requests (0: 30 per round; the last round loads until it is reached)")
	flag.DurationVar(&o.Latency, "latency", 3*time.Millisecond, "the fake Gemini's latency")
	flag.StringVar(&o.Root, "module", "", "module root to build (default: from go env GOMOD)")
	flag.StringVar(&o.Dir, "dir", "", "work folder, kept (default: a temporary one, removed)")
	flag.BoolVar(&o.PowerCut, "powercut", false, "put the database on ext4 on a loop device and cut the power at each kill (root)")
	flag.StringVar(&o.Backend, "backend", "bolt", `storage.backend: "bolt", or "postgres" on the database BREAKWATER_POSTGRES_URL names (its records are the loop's)`)
	flag.Int64Var(&o.Seed, "seed", 0, "random seed (0: from the clock)")
	timeout := flag.Duration("timeout", 20*time.Minute, "bound on the whole run")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	o.Log = func(format string, args ...any) { fmt.Printf(format+"\n", args...) }
	o.PostgresURL = os.Getenv("BREAKWATER_POSTGRES_URL")

	rep, err := Run(ctx, o)
	if rep != nil {
		fmt.Print(rep.Summary())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crashloop:", err)
		os.Exit(1)
	}
	if len(rep.Violations) > 0 {
		os.Exit(1)
	}
}
