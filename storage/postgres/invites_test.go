package postgres_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
	"breakwater/storage/postgres"
)

// An invite copied from bolt keeps its use count and its e-mails; a
// second copy copies nothing.
func TestImportInvite(t *testing.T) {
	t.Parallel()
	db := newDB(t)
	inv := backendtest.NewInvite("inv_old", 3)
	inv.Used = 2
	reds := []postgres.Redemption{{Email: "a@x", At: t0}, {Email: "b@x", At: t0.Add(time.Minute)}}
	for i, want := range []bool{true, false} {
		if copied, err := db.ImportInvite(inv, reds); err != nil || copied != want {
			t.Fatalf("ImportInvite #%d = %v, %v; want %v", i+1, copied, err, want)
		}
	}
	if got, err := db.Redemptions(inv.Hash); err != nil || !reflect.DeepEqual(got, reds) {
		t.Errorf("Redemptions = %+v, %v; want %+v", got, err, reds)
	}
	ctx := context.Background()
	for _, c := range []struct {
		email string
		want  invites.RedeemOutcome
	}{{"a@x", invites.InviteAlreadyRedeemed}, {"c@x", invites.InviteRedeemed}, {"d@x", invites.InviteUsedUp}} {
		if o, err := db.RedeemInvite(ctx, inv.Hash, c.email, t0); err != nil || o != c.want {
			t.Errorf("redeem by %s = %v, %v; want %v", c.email, o, err, c.want)
		}
	}
	if _, err := db.ImportInvite(invites.Invite{ID: "x"}, nil); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("ImportInvite without a hash = %v, want ErrInvalid", err)
	}
}
