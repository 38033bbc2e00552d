package storage

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"breakwater/detect"
)

// randomEvent is an event with every field set from rng (randomText,
// randomNum).
func randomEvent(rng *rand.Rand) detect.Event {
	text, num := func() string { return randomText(rng) }, func() int64 { return randomNum(rng) }
	return detect.Event{
		Time: time.Unix(0, num()).UTC(), UserID: text(), KeyID: text(), Plan: text(), IP: text(), Route: text(),
		Layer: text(), Outcome: text(), Status: int(num()), Bytes: num(), LatencyMS: num(),
		PromptTokens: int(num()), OutputTokens: int(num()), CostMicroUSD: num(), Count: num(),
	}
}

// anEvent is what a paid read records.
func anEvent(user string, t time.Time) detect.Event {
	return detect.Event{Time: t, UserID: user, KeyID: "key_Cab5863yrt", Plan: "free", IP: "203.0.113.7",
		Route: "/v1/ocr", Outcome: "ok", Status: 200, Bytes: 4213, LatencyMS: 840, PromptTokens: 1290,
		OutputTokens: 41, CostMicroUSD: 146}
}

func TestEventRowRoundTrip(t *testing.T) {
	roundTrips(t, rand.New(rand.NewPCG(5, 6)), randomEvent, appendEventRow, decodeEventRow)
}

// TestEventRowSmaller: the reason for the binary form.
func TestEventRowSmaller(t *testing.T) {
	e := anEvent("user-1", t0)
	js, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	if bin := appendEventRow(nil, e); len(bin)*3 > len(js) {
		t.Errorf("binary row %d bytes, JSON %d: want under a third", len(bin), len(js))
	}
}

func TestEventRowMalformed(t *testing.T) {
	refusesMalformed(t, appendEventRow(nil, anEvent("user-1", t0)), func(b []byte) error {
		_, err := decodeEventRow(b)
		return err
	})
}

// TestEventsReadBothForms: a database from before schema 5 has JSON
// events; after the upgrade new events are binary, written in one buffer
// per batch, and EachEvent returns both kinds in time order.
func TestEventsReadBothForms(t *testing.T) {
	old := anEvent("old-user", t0)
	old.Layer, old.Count = "rate", 3
	path := asOlderBuildWrote(t, 4, bucketEvents, timeKey(old.Time, 1), old)

	db := mustOpenPath(t, path, Options{})
	fresh := []detect.Event{anEvent("new-user", t0.Add(time.Second)), anEvent("other", t0.Add(2*time.Second))}
	fresh[1].UserID = string(bytes.Repeat([]byte("é"), 300)) // a length of more than one byte
	if err := db.AppendEvents(fresh); err != nil {
		t.Fatal(err)
	}
	rowsWithAreBinary(t, db, bucketEvents, "new-user", eventRowV1)
	got, err := db.Events(time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !got[0].Time.Equal(old.Time) || got[0].UserID != old.UserID || got[0].Layer != "rate" || got[0].Count != 3 ||
		!reflect.DeepEqual(got[1:], fresh) {
		t.Errorf("Events = %+v, want the JSON event then the two binary ones", got)
	}
}
