package postgres_test

import (
	"testing"
)

// The brake set through one instance is read by another; unset is off.
func TestFlagsAcrossInstances(t *testing.T) {
	t.Parallel()
	url := migratedDatabase(t)
	a, b := open(t, url), open(t, url)
	if on, err := b.Flag("brake"); err != nil || on {
		t.Fatalf("Flag(brake) never set = %v, %v; want off", on, err)
	}
	for _, want := range []bool{true, false, true} {
		if err := a.SetFlag("brake", want); err != nil {
			t.Fatal(err)
		}
		if on, err := b.Flag("brake"); err != nil || on != want {
			t.Errorf("B's Flag(brake) after A set %v = %v, %v", want, on, err)
		}
	}
	if on, err := b.Flag("other"); err != nil || on {
		t.Errorf("Flag(other) = %v, %v; want off", on, err)
	}
}
