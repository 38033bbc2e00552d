package storage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/budget"
)

// randomText is up to 40 bytes of anything, not only UTF-8.
func randomText(rng *rand.Rand) string {
	b := make([]byte, rng.IntN(40))
	for i := range b {
		b[i] = byte(rng.IntN(256))
	}
	return string(b)
}

// randomNum is a number up to the extremes of an int64.
func randomNum(rng *rand.Rand) int64 {
	switch rng.IntN(4) {
	case 0:
		return math.MaxInt64
	case 1:
		return math.MinInt64
	default:
		return rng.Int64N(1<<40) - 1<<39
	}
}

// randomUsage is a usage record with every field set from rng.
func randomUsage(rng *rand.Rand) budget.UsageRecord {
	text, num := func() string { return randomText(rng) }, func() int64 { return randomNum(rng) }
	return budget.UsageRecord{
		Time: time.Unix(0, num()).UTC(), UserID: "u" + text(), KeyID: text(), RequestID: text(),
		Model: text(), Outcome: text(), Bytes: num(), PromptTokens: int(num()), CandidatesTokens: int(num()),
		ThoughtsTokens: int(num()), CostMicroUSD: num(), LatencyMS: num(),
	}
}

func TestUsageRowRoundTrip(t *testing.T) {
	roundTrips(t, rand.New(rand.NewPCG(1, 2)), randomUsage, appendUsageRow, decodeUsageRow)
}

// roundTrips: 2,000 values from random, encoded with appendRow, decode
// back to what they were.
func roundTrips[T any](t *testing.T, rng *rand.Rand, random func(*rand.Rand) T, appendRow func([]byte, T) []byte, decode func([]byte) (T, error)) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		want := random(rng)
		got, err := decode(appendRow(nil, want))
		if err != nil {
			t.Fatalf("value %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("value %d: decoded %+v, want %+v", i, got, want)
		}
	}
}

// TestUsageRowSmaller: the reason for the binary form.
func TestUsageRowSmaller(t *testing.T) {
	rec := usageAt("user-1", t0)
	js, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	bin := appendUsageRow(nil, rec)
	if len(bin)*2 > len(js) {
		t.Errorf("binary row %d bytes, JSON %d: want under half", len(bin), len(js))
	}
}

func TestUsageRowMalformed(t *testing.T) {
	refusesMalformed(t, appendUsageRow(nil, usageAt("user-1", t0)), func(b []byte) error {
		_, err := decodeUsageRow(b)
		return err
	})
}

// refusesMalformed: row, a good binary row, is refused by decode when it
// is cut anywhere (a cut binary row with errStoredRow), has a byte more,
// has an unknown format byte, or when JSON does not parse.
func refusesMalformed(t *testing.T, row []byte, decode func([]byte) error) {
	t.Helper()
	for n := 0; n < len(row); n++ {
		if decode(row[:n]) == nil {
			t.Errorf("row cut to %d of %d bytes decoded", n, len(row))
		}
	}
	for name, b := range map[string][]byte{
		"trailing byte": append(bytes.Clone(row), 0),
		"unknown form":  append([]byte{0x02}, row[1:]...),
		"bad JSON":      []byte(`{"UserID":`),
	} {
		if decode(b) == nil {
			t.Errorf("%s: %q decoded", name, b)
		}
	}
	if err := decode(row[:len(row)-1]); !errors.Is(err, errStoredRow) {
		t.Errorf("truncated row: %v, want errStoredRow", err)
	}
}

// TestUsageReadsBothForms: a database from before schema 4 has JSON usage
// rows; after the upgrade new rows are binary, and Usage returns both in
// time order.
func TestUsageReadsBothForms(t *testing.T) {
	old := usageAt("old-user", t0)
	path := asOlderBuildWrote(t, 3, bucketUsage, timeKey(old.Time, 1), old)

	db := mustOpenPath(t, path, Options{})
	fresh := usageAt("new-user", t0.Add(time.Second))
	if err := db.RecordUsage(t.Context(), month, fresh, budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	rowsWithAreBinary(t, db, bucketUsage, "new-user", usageRowV1)
	got, err := db.Usage(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[0].Time.Equal(old.Time) || got[0].UserID != old.UserID || got[0].RequestID != old.RequestID ||
		!reflect.DeepEqual(got[1], fresh) {
		t.Errorf("Usage = %+v, want the JSON row then the binary one", got)
	}
}

// rowsWithAreBinary fails t unless every row of bucket that contains
// marker is in the binary form of format byte version.
func rowsWithAreBinary(t *testing.T, db *DB, bucket []byte, marker string, version byte) {
	t.Helper()
	err := db.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			if bytes.Contains(v, []byte(marker)) && v[0] != version {
				t.Errorf("new row %q is not in the binary form", v)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}

// asOlderBuildWrote makes a database as a build of schema version wrote
// it: fresh, with v stored as JSON under key in bucket. It returns the
// path, the database closed.
func asOlderBuildWrote(t *testing.T, version uint64, bucket, key []byte, v any) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "breakwater.db")
	db, err := Open(path, Options{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	bdb, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bbolt.Tx) error {
		js, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := tx.Bucket(bucket).Put(key, js); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, encodeUint64(version))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// FuzzDecodeRows: any bytes as a usage row, a stored answer or an event decode or
// are refused, never panic, and what decodes from a binary row encodes
// back to the same bytes.
func FuzzDecodeRows(f *testing.F) {
	f.Add(appendUsageRow(nil, usageAt("user-1", t0)))
	js, _ := json.Marshal(usageAt("user-2", t0))
	f.Add(js)
	f.Add(appendAnswerRow(nil, randomAnswer(rand.New(rand.NewPCG(7, 8)))))
	f.Add(appendEventRow(nil, anEvent("user-3", t0)))
	f.Fuzz(func(t *testing.T, row []byte) {
		if r, err := decodeUsageRow(row); err == nil && row[0] != '{' {
			if again := appendUsageRow(nil, r); !bytes.Equal(again, row) {
				t.Fatalf("usage row %x decodes as %+v, which encodes as %x", row, r, again)
			}
		}
		if a, err := decodeAnswerRow(row); err == nil && row[0] != '{' {
			if again := appendAnswerRow(nil, a); !bytes.Equal(again, row) {
				t.Fatalf("answer row %x decodes as %+v, which encodes as %x", row, a, again)
			}
		}
		if e, err := decodeEventRow(row); err == nil && row[0] != '{' {
			if again := appendEventRow(nil, e); !bytes.Equal(again, row) {
				t.Fatalf("event row %x decodes as %+v, which encodes as %x", row, e, again)
			}
		}
	})
}

// TestCheckMonthAndDayAgreeWithTimeParse: the hand-written checks accept
// exactly what time.Parse accepts and formats back the same.
func TestCheckMonthAndDayAgreeWithTimeParse(t *testing.T) {
	byParse := func(layout, s string) bool {
		v, err := time.Parse(layout, s)
		return err == nil && v.Format(layout) == s
	}
	months := []string{"2026-01", "2026-12", "0000-01", "9999-12", "2026-00", "2026-13", "2026-1", "2026/01",
		"202a-01", "2026-0a", "-026-01", "2026-01 ", "", "20260-1", "+026-01", "2026-+1"}
	days := []string{"2026-01-01", "2026-02-28", "2026-02-29", "2024-02-29", "1900-02-29", "2000-02-29", "2026-04-31",
		"2026-12-31", "2026-12-32", "2026-12-00", "2026-13-01", "2026-1-01", "2026-01-1", "2026-01-01x", "2026-01/01", "0000-02-29"}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		b := []byte(fmt.Sprintf("%04d-%02d-%02d", rng.IntN(10000), rng.IntN(14), rng.IntN(33)))
		if rng.IntN(4) == 0 {
			b[rng.IntN(len(b))] = "0123456789-+ x"[rng.IntN(14)]
		}
		days = append(days, string(b))
		months = append(months, string(b[:7]))
	}
	for _, m := range months {
		if got, want := checkMonth(m) == nil, byParse(monthLayout, m); got != want {
			t.Errorf("checkMonth(%q) accepts: %v, time.Parse: %v", m, got, want)
		}
	}
	for _, d := range days {
		if got, want := checkDay(d) == nil, byParse(dayLayout, d); got != want {
			t.Errorf("checkDay(%q) accepts: %v, time.Parse: %v", d, got, want)
		}
	}
}

// randomAnswer is a stored answer with every field drawn from rng.
func randomAnswer(rng *rand.Rand) storedAnswer {
	list := func() []string {
		var l []string
		for range rng.IntN(4) {
			l = append(l, randomUsage(rng).KeyID)
		}
		return l
	}
	a := storedAnswer{At: time.Unix(0, rng.Int64()-rng.Int64()).UTC(), Fingerprint: make([]byte, 32),
		Status: rng.IntN(600), Serials: list(), Rejected: list(), Simulated: rng.IntN(2) == 1}
	for i := range a.Fingerprint {
		a.Fingerprint[i] = byte(rng.IntN(256))
	}
	if rng.IntN(2) == 0 {
		a.Body = []byte(randomUsage(rng).RequestID + "x")
	}
	return a
}

func TestAnswerRowRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 2000; i++ {
		want := randomAnswer(rng)
		row := appendAnswerRow(nil, want)
		got, err := decodeAnswerRow(row)
		if err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("answer %d: decoded %+v, want %+v", i, got, want)
		}
		if at, err := answerTime(row); err != nil || !at.Equal(want.At) {
			t.Fatalf("answer %d: answerTime = %v, %v; want %v", i, at, err, want.At)
		}
		for n := 0; n < len(row); n++ {
			if _, err := decodeAnswerRow(row[:n]); err == nil {
				t.Fatalf("answer %d cut to %d of %d bytes decoded", i, n, len(row))
			}
		}
	}
	bad := appendAnswerRow(nil, storedAnswer{At: t0, Fingerprint: make([]byte, 32)})
	bad[len(bad)-1] = 2
	if _, err := decodeAnswerRow(bad); !errors.Is(err, errStoredRow) {
		t.Errorf("simulated flag 2: %v, want errStoredRow", err)
	}
}

// TestAnswersReadBothForms: answers kept as JSON before schema 4 are still
// found, replayed and pruned; new ones are binary.
func TestAnswersReadBothForms(t *testing.T) {
	db := mustOpen(t)
	old := storedAnswer{At: t0, Fingerprint: bytes.Repeat([]byte{7}, 32), Status: 200, Body: []byte(`{"serials":["A1"]}`)}
	js, err := json.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	err = db.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketIdempotency).Put(userKey("u1", []byte("old-key")), js)
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := usageAt("u1", t0.Add(time.Hour))
	rec.Answer = &budget.Answer{IdempotencyKey: "new-key", Status: 200, Body: []byte(`{"serials":["B2"]}`), Serials: []string{"B2"}}
	rec.Answer.Fingerprint[0] = 9
	if err := db.RecordUsage(t.Context(), month, rec, budget.Settlement{}); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"old-key": `{"serials":["A1"]}`, "new-key": `{"serials":["B2"]}`} {
		a, _, found, err := db.StoredAnswer("u1", key)
		if err != nil || !found || string(a.Body) != want {
			t.Errorf("StoredAnswer(%s) = %q, %v, %v; want %s", key, a.Body, found, err, want)
		}
	}
	a, at, found, err := db.RecentRead("u1", rec.Answer.Fingerprint)
	if err != nil || !found || !at.Equal(rec.Time) || !reflect.DeepEqual(a.Serials, []string{"B2"}) {
		t.Errorf("RecentRead = %+v at %v, %v, %v", a, at, found, err)
	}
	err = db.view(func(tx *bbolt.Tx) error {
		if v := tx.Bucket(bucketIdempotency).Get(userKey("u1", []byte("new-key"))); len(v) == 0 || v[0] != answerRowV1 {
			t.Errorf("new answer row %q is not binary", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Pruning before a time between the two drops the old JSON row only.
	if n, err := db.PruneAnswers(t0.Add(time.Minute), time.Time{}); err != nil || n != 1 {
		t.Fatalf("PruneAnswers = %d, %v; want 1", n, err)
	}
	if _, _, found, _ := db.StoredAnswer("u1", "old-key"); found {
		t.Error("the old answer outlived its pruning")
	}
	if _, _, found, _ := db.StoredAnswer("u1", "new-key"); !found {
		t.Error("the new answer was pruned")
	}
}

// TestKeepAnswer: an answer kept under a key alone is found by the key, as
// of its time, and pruned with the others; a keyless one is refused.
func TestKeepAnswer(t *testing.T) {
	db := mustOpen(t)
	a := budget.Answer{IdempotencyKey: "k1", Status: 200, Body: []byte(`{"cached":true}`)}
	a.Fingerprint[0] = 5
	if err := db.KeepAnswer("u1", t0, a); err != nil {
		t.Fatal(err)
	}
	got, at, found, err := db.StoredAnswer("u1", "k1")
	if err != nil || !found || !at.Equal(t0) || got.Fingerprint != a.Fingerprint || string(got.Body) != string(a.Body) || got.Status != 200 {
		t.Errorf("StoredAnswer = %+v at %v, %v, %v; want %+v at %v", got, at, found, err, a, t0)
	}
	if _, _, found, _ := db.StoredAnswer("u2", "k1"); found {
		t.Error("another user's key found it")
	}
	if _, _, found, _ := db.RecentRead("u1", a.Fingerprint); found {
		t.Error("a kept answer is not a read of the image")
	}
	if err := db.KeepAnswer("u1", t0, budget.Answer{}); err == nil {
		t.Error("an answer without a key was kept")
	}
	if n, err := db.PruneAnswers(t0.Add(time.Second), time.Time{}); err != nil || n != 1 {
		t.Errorf("PruneAnswers = %d, %v; want 1", n, err)
	}
}
