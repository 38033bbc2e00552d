package invites

import (
	"errors"
	"testing"
)

func TestKey(t *testing.T) {
	k1, err := NewKey([]byte("0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	k2, _ := NewKey([]byte("0123456789abcdeF"))
	code := NormaliseCode(NewCode())
	if k1.Hash(code) == Digest(code) {
		t.Error("the keyed hash is the plain SHA-256")
	}
	if k1.Hash(code) == k2.Hash(code) {
		t.Error("two secrets give the same hash")
	}
	if got, want := k1.Rekey(Digest(code)), k1.Hash(code); got != want {
		t.Error("Rekey of the stored digest is not the keyed hash: legacy invites could not move")
	}
	if string(k1.Mark()) == string(k2.Mark()) {
		t.Error("two secrets give the same mark")
	}
	if _, err := NewKey([]byte("too short")); !errors.Is(err, ErrShortSecret) {
		t.Errorf("NewKey(short) = %v", err)
	}
}
