package storage

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"go.etcd.io/bbolt"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
)

// TestInviteRedemptionFailsClosed: an invite whose redemptions bucket is
// missing is an error for both the check and the redemption, never "not
// redeemed yet", and nothing is written.
func TestInviteRedemptionFailsClosed(t *testing.T) {
	db := mustOpen(t)
	inv := backendtest.NewInvite("inv_damaged", 3)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	if err := db.update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketRedemptions).DeleteBucket(inv.Hash[:])
	}); err != nil {
		t.Fatal(err)
	}
	if o, err := db.CheckInvite(inv.Hash, "a@x", t0); err == nil {
		t.Errorf("CheckInvite = %v, nil; want an error", o)
	}
	if o, err := db.RedeemInvite(context.Background(), inv.Hash, "a@x", t0); err == nil || o != invites.InviteUnknown {
		t.Errorf("RedeemInvite = %v, %v; want InviteUnknown and an error", o, err)
	}
	if stored, _ := db.InviteByHash(inv.Hash); stored.Used != 0 {
		t.Errorf("uses %d after a failed redemption, want 0", stored.Used)
	}
	if _, err := db.Redemptions(inv.Hash); err == nil {
		t.Error("Redemptions: nil error, want one")
	}
}

// TestDeleteInviteDropsItsBucket: deleting an invite drops its
// redemptions bucket and no other; Redemptions of a code no invite has is
// ErrNotFound. (What any backend does on delete is the suite's
// backendtest.Invites.)
func TestDeleteInviteDropsItsBucket(t *testing.T) {
	db := mustOpen(t)
	inv, other := backendtest.NewInvite("inv_del", 3), backendtest.NewInvite("inv_keep", 3)
	for _, i := range []invites.Invite{inv, other} {
		if err := db.CreateInvite(i); err != nil {
			t.Fatal(err)
		}
		if _, err := db.RedeemInvite(context.Background(), i.Hash, "a@x", t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.DeleteInvite("inv_del"); err != nil {
		t.Fatal(err)
	}
	err := db.view(func(tx *bbolt.Tx) error {
		if tx.Bucket(bucketRedemptions).Bucket(inv.Hash[:]) != nil {
			t.Error("redemptions bucket of the deleted invite is still there")
		}
		if tx.Bucket(bucketRedemptions).Bucket(other.Hash[:]) == nil {
			t.Error("redemptions bucket of the other invite is gone")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Redemptions(sha256.Sum256([]byte("nope"))); !errors.Is(err, ErrNotFound) {
		t.Errorf("redemptions of unknown: %v, want ErrNotFound", err)
	}
}

// TestBackupKeepsRedemptions: a backup is a whole database, redemptions
// buckets included, so a restored copy knows who redeemed what.
func TestBackupKeepsRedemptions(t *testing.T) {
	db := mustOpen(t)
	ctx := context.Background()
	inv := backendtest.NewInvite("inv_backup", 3)
	if err := db.CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	for _, email := range []string{"a@x", "b@x"} {
		if _, err := db.RedeemInvite(ctx, inv.Hash, email, t0); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "copy.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Backup(f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	restored := mustOpenPath(t, path, Options{})
	if got, _ := restored.InviteByHash(inv.Hash); got.Used != 2 {
		t.Errorf("restored uses %d, want 2", got.Used)
	}
	if o, err := restored.CheckInvite(inv.Hash, "b@x", t0); err != nil || o != invites.InviteAlreadyRedeemed {
		t.Errorf("b@x on the restored copy: %v %v, want InviteAlreadyRedeemed", o, err)
	}
	if reds, err := restored.Redemptions(inv.Hash); err != nil || len(reds) != 2 {
		t.Errorf("restored redemptions %v %v, want 2", reds, err)
	}
}
