package postgres_test

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"breakwater/storage/postgres"
)

func TestSaveLoadDropStates(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	if got, err := db.LoadState("never"); err != nil || len(got) != 0 {
		t.Fatalf("LoadState of a state never saved = %v, %v; want empty", got, err)
	}
	binary := string([]byte{0, 0xff, 'k'}) // keys are bytes, not text
	if err := db.SaveState("windows", map[string][]byte{"alice": []byte("w1"), binary: {0, 1}, "gone": []byte("x"), "": []byte("skipped")}); err != nil {
		t.Fatal(err)
	}
	if err := db.SaveState("windows", map[string][]byte{"alice": []byte("w2"), "gone": nil}); err != nil {
		t.Fatal(err)
	}
	got, err := db.LoadState("windows")
	want := map[string][]byte{"alice": []byte("w2"), binary: {0, 1}}
	if err != nil || !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("LoadState = %q, %v; want %q", got, err, want)
	}
	if err := db.SaveState("", map[string][]byte{"a": nil}); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("SaveState without a name = %v, want ErrInvalid", err)
	}
	for _, name := range []string{"attempts/2026-11-29", "attempts/2026-11-30", "attempts/2026-12-01", "refusals/2026-11-29"} {
		if err := db.SaveState(name, map[string][]byte{"u": {1}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.DropStates("attempts/", "attempts/2026-11-30"); err != nil {
		t.Fatal(err)
	}
	for name, kept := range map[string]bool{"attempts/2026-11-29": false, "attempts/2026-11-30": true, "attempts/2026-12-01": true, "refusals/2026-11-29": true, "windows": true} {
		if got, err := db.LoadState(name); err != nil || (len(got) > 0) != kept {
			t.Errorf("%s after DropStates: %v, %v; kept want %v", name, got, err, kept)
		}
	}
}
