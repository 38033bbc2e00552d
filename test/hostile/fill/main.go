// Command fill writes the large databases of the records tests in
// test/hostile straight through storage's API: a million recorded
// events, or a hundred thousand users. The tests build it without -race
// and run it as a process of its own: under -race, writing the rows in
// the test's own process was most of those tests' time (some 45 s of
// CPU), the race detector's bookkeeping of bbolt's pages, not the rows.
//
// Modes:
//
//	events  -users U -per-user N -day YYYY-MM-DD -plan P: N requests of
//	        each of U users, 80 ms apart over the day, user by user in
//	        turn, written in time order as the recorder does
//	users   -users U -plan P: U users with a key each (the key is not
//	        in the usage list), 10,000 to a transaction
//
// It prints how many rows it wrote.
package main

import (
	"crypto/sha256"
	"flag"
	"fmt"
	"os"
	"time"

	"breakwater/detect"
	"breakwater/server/keys"
	"breakwater/storage"
)

func main() {
	db := flag.String("db", "", "the bolt database to write (created if absent)")
	mode := flag.String("mode", "", "events or users")
	users := flag.Int("users", 0, "users")
	perUser := flag.Int("per-user", 0, "requests of each user (events)")
	day := flag.String("day", "", "the day of the events, YYYY-MM-DD (UTC)")
	plan := flag.String("plan", "", "the users' plan")
	flag.Parse()
	n, err := fill(*db, *mode, *users, *perUser, *day, *plan)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fill:", err)
		os.Exit(1)
	}
	fmt.Println(n)
}

func fill(path, mode string, users, perUser int, day, plan string) (n int, err error) {
	if path == "" || users <= 0 || plan == "" {
		return 0, fmt.Errorf("-db, -users and -plan are needed")
	}
	db, err := storage.Open(path, storage.Options{NoSync: true}) // a throwaway file
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := db.Close(); err == nil {
			err = cerr
		}
	}()
	switch mode {
	case "events":
		return events(db, users, perUser, day, plan)
	case "users":
		return withKeys(db, users, plan)
	}
	return 0, fmt.Errorf("unknown -mode %q", mode)
}

func events(db *storage.DB, users, perUser int, day, plan string) (int, error) {
	start, err := time.Parse("2006-01-02", day)
	if err != nil {
		return 0, fmt.Errorf("-day: %w", err)
	}
	n := 0
	batch := make([]detect.Event, 0, 20_000)
	flush := func() error {
		err := db.AppendEvents(batch)
		n += len(batch)
		batch = batch[:0]
		return err
	}
	for i := range perUser {
		for u := range users {
			at := start.Add(time.Duration(i*users+u) * 80 * time.Millisecond)
			batch = append(batch, detect.Event{Time: at, UserID: fmt.Sprintf("user-%05d", u), KeyID: "k", Plan: plan, IP: "192.0.2.1",
				Route: "/v1/ocr", Outcome: "ok", Status: 200, Bytes: 1000, LatencyMS: 900, PromptTokens: 300, OutputTokens: 100, CostMicroUSD: 60})
			if len(batch) == cap(batch) {
				if err := flush(); err != nil {
					return n, err
				}
			}
		}
	}
	return n, flush()
}

func withKeys(db *storage.DB, users int, plan string) (int, error) {
	created := time.Now().UTC()
	ks, us := make([]keys.Key, users), make([]keys.User, users)
	for i := range users {
		id := fmt.Sprintf("user-%06d", i)
		ks[i] = keys.Key{ID: "key_" + id, Hash: sha256.Sum256([]byte("bw_" + id)), UserID: id, CreatedAt: created}
		us[i] = keys.User{ID: id, Plan: plan, CreatedAt: created}
	}
	for i := 0; i < users; i += 10_000 { // bbolt's nodes split at commit: one transaction of 100,000 puts is quadratic
		end := min(i+10_000, users)
		if err := db.CreateKeys(ks[i:end], us[i:end]); err != nil {
			return i, err
		}
	}
	return users, nil
}
