package postgres_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"breakwater/budget"
	"breakwater/storage/postgres"
)

func readRecord(user string, at time.Time, a *budget.Answer) budget.UsageRecord {
	return budget.UsageRecord{Time: at, UserID: user, KeyID: "k1", Answer: a}
}

// A read's answer kept through one instance is found by key and by image
// through another, for its own user only, with its time.
func TestAnswersAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	ctx := context.Background()
	fp := sha256.Sum256([]byte("image/png image"))
	ans := &budget.Answer{Fingerprint: fp, IdempotencyKey: "idem-1", Status: 200, Body: []byte(`{"serials":["A1"]}`),
		Serials: []string{"A1", "B2"}, Rejected: []string{"x"}, Simulated: true}
	if err := a.KeepReadAnswer(ctx, readRecord("alice", t0, ans)); err != nil {
		t.Fatal(err)
	}
	got, at, found, err := b.StoredAnswer("alice", "idem-1")
	want := budget.Answer{Fingerprint: fp, IdempotencyKey: "idem-1", Status: 200, Body: ans.Body}
	if err != nil || !found || !at.Equal(t0) || !reflect.DeepEqual(got, want) {
		t.Errorf("StoredAnswer = %+v, %v, %v, %v; want %+v at %v", got, at, found, err, want, t0)
	}
	got, at, found, err = b.RecentRead("alice", fp)
	want = budget.Answer{Fingerprint: fp, Serials: ans.Serials, Rejected: ans.Rejected, Simulated: true}
	if err != nil || !found || !at.Equal(t0) || !reflect.DeepEqual(got, want) {
		t.Errorf("RecentRead = %+v, %v, %v, %v; want %+v at %v", got, at, found, err, want, t0)
	}
	for name, look := range map[string]func() (bool, error){
		"other user's key":   func() (bool, error) { _, _, f, err := b.StoredAnswer("bob", "idem-1"); return f, err },
		"other user's image": func() (bool, error) { _, _, f, err := b.RecentRead("bob", fp); return f, err },
		"other key":          func() (bool, error) { _, _, f, err := b.StoredAnswer("alice", "idem-2"); return f, err },
	} {
		if found, err := look(); err != nil || found {
			t.Errorf("%s: found %v, %v; want nothing", name, found, err)
		}
	}
	// A read without a key keeps its image only; one without an answer nothing.
	fp2 := sha256.Sum256([]byte("second"))
	if err := a.KeepReadAnswer(ctx, readRecord("alice", t0, &budget.Answer{Fingerprint: fp2})); err != nil {
		t.Fatal(err)
	}
	if err := a.KeepReadAnswer(ctx, readRecord("alice", t0, nil)); err != nil {
		t.Fatal(err)
	}
	if got, _, found, err := b.RecentRead("alice", fp2); err != nil || !found || got.Serials != nil || got.Simulated {
		t.Errorf("RecentRead of a read without serials = %+v, %v, %v", got, found, err)
	}
	// KeepAnswer binds a key to an answer that made no read.
	later := t0.Add(time.Minute)
	if err := b.KeepAnswer("alice", later, budget.Answer{Fingerprint: fp2, IdempotencyKey: "idem-2", Status: 200, Body: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if got, at, found, err := a.StoredAnswer("alice", "idem-2"); err != nil || !found || !at.Equal(later) || got.Fingerprint != fp2 {
		t.Errorf("StoredAnswer after KeepAnswer = %+v, %v, %v, %v", got, at, found, err)
	}
	if err := b.KeepAnswer("alice", later, budget.Answer{}); err == nil {
		t.Error("KeepAnswer without a key succeeded")
	}
	if err := a.KeepReadAnswer(ctx, readRecord("", t0, &budget.Answer{Fingerprint: fp2})); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("an answer without a user = %v, want ErrInvalid", err)
	}
}

func TestPruneAnswers(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	ctx := context.Background()
	for i, at := range []time.Time{t0, t0.Add(time.Hour), t0.Add(2 * time.Hour)} {
		fp := sha256.Sum256([]byte{byte(i)})
		key := string(rune('a' + i))
		if err := db.KeepReadAnswer(ctx, readRecord("u", at, &budget.Answer{Fingerprint: fp, IdempotencyKey: key, Status: 200})); err != nil {
			t.Fatal(err)
		}
	}
	// Keys before t0+2h go (a and b), images before t0+1h (the first).
	n, err := db.PruneAnswers(t0.Add(2*time.Hour), t0.Add(time.Hour))
	if err != nil || n != 3 {
		t.Fatalf("PruneAnswers = %d, %v; want 3", n, err)
	}
	for key, want := range map[string]bool{"a": false, "b": false, "c": true} {
		if _, _, found, err := db.StoredAnswer("u", key); err != nil || found != want {
			t.Errorf("key %s after prune: found %v, %v; want %v", key, found, err, want)
		}
	}
	if _, _, found, _ := db.RecentRead("u", sha256.Sum256([]byte{1})); !found {
		t.Error("the image read at t0+1h was pruned")
	}
}

// The same idempotency key sent to two instances at once: exactly one
// claim wins, so one upstream call is made; the others find the kept
// answer once the winner's read is recorded.
func TestClaimAnswerAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	dbs := []*postgres.DB{open(t, url), open(t, url)}
	ctx := context.Background()
	var won atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 20 {
		wg.Go(func() {
			<-start
			ok, err := dbs[i%2].ClaimAnswer(ctx, "alice", "idem-1", time.Minute)
			if err != nil {
				t.Error(err)
			}
			if ok {
				won.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if got := won.Load(); got != 1 {
		t.Fatalf("%d claims won, want exactly 1", got)
	}
	// Another user's same key is a claim of its own.
	if ok, err := dbs[1].ClaimAnswer(ctx, "bob", "idem-1", time.Minute); err != nil || !ok {
		t.Errorf("bob's claim = %v, %v; want won", ok, err)
	}
}

// A claim goes with the kept answer or a release, only the holder's; one
// left by a crashed instance lapses after its ttl.
func TestClaimAnswerReleaseAndExpiry(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	var mu sync.Mutex
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	openClocked := func() *postgres.DB {
		db, err := postgres.Open(context.Background(), url, postgres.Options{Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	a, b := openClocked(), openClocked()
	ctx := context.Background()
	claim := func(db *postgres.DB) bool {
		t.Helper()
		ok, err := db.ClaimAnswer(ctx, "alice", "k", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !claim(a) || claim(b) {
		t.Fatal("first claim lost or second won")
	}
	if err := b.ReleaseAnswer(ctx, "alice", "k"); err != nil || claim(b) {
		t.Fatalf("B released A's claim (%v)", err)
	}
	if err := a.ReleaseAnswer(ctx, "alice", "k"); err != nil || !claim(b) {
		t.Fatalf("after A's release B could not claim (%v)", err)
	}
	// B's read is recorded: its answer is kept and its claim goes.
	if err := b.KeepReadAnswer(ctx, readRecord("alice", t0, &budget.Answer{IdempotencyKey: "k", Status: 200})); err != nil {
		t.Fatal(err)
	}
	if !claim(a) {
		t.Fatal("the claim outlived the kept answer")
	}
	// A crashes holding it: B waits out the ttl, not more.
	mu.Lock()
	now = now.Add(time.Minute - time.Second)
	mu.Unlock()
	if claim(b) {
		t.Fatal("B took A's claim before its ttl")
	}
	mu.Lock()
	now = now.Add(time.Second)
	mu.Unlock()
	if !claim(b) {
		t.Fatal("A's claim did not lapse after its ttl")
	}
	if _, err := a.ClaimAnswer(ctx, "alice", "", time.Minute); err == nil {
		t.Error("a claim of an empty key succeeded")
	}
}

// The protocol the HTTP edge follows with a kept answer and a claim: look
// for the answer; if none, claim the key; the winner looks again, reads
// (one upstream call) and keeps the answer with its usage record; a loser
// waits for the kept answer. Ten requests with one key over two instances
// make one call and all get its answer.
func TestOneUpstreamCallPerIdempotencyKey(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	dbs := []*postgres.DB{open(t, url), open(t, url)}
	var calls atomic.Int32
	request := func(db *postgres.DB) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for {
			if a, _, found, err := db.StoredAnswer("alice", "idem"); err != nil || found {
				return a.Body, err
			}
			won, err := db.ClaimAnswer(ctx, "alice", "idem", time.Minute)
			if err != nil {
				return nil, err
			}
			if won {
				if a, _, found, err := db.StoredAnswer("alice", "idem"); err != nil || found {
					return a.Body, err
				}
				body := []byte(fmt.Sprintf(`{"call":%d}`, calls.Add(1)))
				rec := readRecord("alice", t0, &budget.Answer{IdempotencyKey: "idem", Status: 200, Body: body})
				return body, db.KeepReadAnswer(ctx, rec)
			}
			select { // another instance reads: wait for its answer
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	bodies := make([][]byte, 10)
	var wg sync.WaitGroup
	for i := range bodies {
		wg.Go(func() {
			var err error
			if bodies[i], err = request(dbs[i%2]); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := calls.Load(); got != 1 {
		t.Fatalf("%d upstream calls for one idempotency key, want 1", got)
	}
	for i, b := range bodies {
		if string(b) != `{"call":1}` {
			t.Errorf("request %d got %q, want the one call's answer", i, b)
		}
	}
}
