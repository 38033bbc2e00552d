package postgres_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage/postgres"
	"breakwater/storage/postgres/pgtest"
)

func newInvite(id string, uses int) invites.Invite {
	return invites.Invite{ID: id, Hash: sha256.Sum256([]byte("code-" + id)), MaxUses: uses, CreatedAt: t0, Note: "for " + id}
}

func TestInviteRedemptionOutcomes(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	one, two, exp, rev := newInvite("inv_one", 1), newInvite("inv_two", 2), newInvite("inv_exp", 5), newInvite("inv_rev", 5)
	exp.ExpiresAt = t0.Add(time.Hour)
	for _, inv := range []invites.Invite{one, two, exp, rev} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.RevokeInvite("inv_rev", t0); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		hash  [32]byte
		email string
		at    time.Time
		want  invites.RedeemOutcome
	}{
		{"unknown", sha256.Sum256([]byte("nope")), "a@x", t0, invites.InviteUnknown},
		{"first use", one.Hash, "a@x", t0, invites.InviteRedeemed},
		{"same e-mail again", one.Hash, "a@x", t0.Add(time.Minute), invites.InviteAlreadyRedeemed},
		{"used up", one.Hash, "b@x", t0, invites.InviteUsedUp},
		{"two uses: first", two.Hash, "a@x", t0, invites.InviteRedeemed},
		{"two uses: second", two.Hash, "b@x", t0, invites.InviteRedeemed},
		{"two uses: third", two.Hash, "c@x", t0, invites.InviteUsedUp},
		{"before expiry", exp.Hash, "a@x", t0.Add(time.Hour - 1), invites.InviteRedeemed},
		{"at expiry", exp.Hash, "b@x", t0.Add(time.Hour), invites.InviteExpired},
		{"revoked", rev.Hash, "a@x", t0, invites.InviteRevoked},
	}
	for _, c := range cases {
		// The read-only check agrees with the binding redemption.
		checked, err := db.CheckInvite(c.hash, c.email, c.at)
		if err != nil || checked != c.want {
			t.Errorf("%s: CheckInvite = %v, %v; want %v", c.name, checked, err, c.want)
		}
		got, err := db.RedeemInvite(ctx, c.hash, c.email, c.at)
		if err != nil || got != c.want {
			t.Errorf("%s: RedeemInvite = %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	inv, err := db.InviteByHash(two.Hash)
	if err != nil || inv.Used != 2 {
		t.Errorf("two: %+v, %v; want 2 uses", inv, err)
	}
	reds, err := db.Redemptions(two.Hash)
	if got, want := fmt.Sprint(reds), fmt.Sprint([]postgres.Redemption{{Email: "a@x", At: t0}, {Email: "b@x", At: t0}}); err != nil || got != want {
		t.Errorf("two: redemptions %s, %v; want %s", got, err, want)
	}
	if reds, _ = db.Redemptions(one.Hash); len(reds) != 1 || reds[0].Email != "a@x" || !reds[0].At.Equal(t0) {
		t.Errorf("one: redemptions %v, want only a@x at t0 (a second try changes nothing)", reds)
	}
	if _, err := db.InviteByHash(sha256.Sum256([]byte("nope"))); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("unknown hash: %v, want invites.ErrNotFound", err)
	}
	if _, err := db.RedeemInvite(ctx, one.Hash, "", t0); !errors.Is(err, postgres.ErrInvalid) {
		t.Errorf("redeem without e-mail: %v, want ErrInvalid", err)
	}
}

// redeemInParallel redeems hash from n goroutines spread over dbs, with
// the e-mail email(i), and counts the outcomes.
func redeemInParallel(t *testing.T, dbs []*postgres.DB, hash [32]byte, n int, email func(int) string) map[invites.RedeemOutcome]int {
	t.Helper()
	var mu sync.Mutex
	got := map[invites.RedeemOutcome]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			o, err := dbs[i%len(dbs)].RedeemInvite(context.Background(), hash, email(i), t0)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			got[o]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return got
}

// A one-use code redeemed by 20 e-mails at once over two instances lets
// exactly one in.
func TestInviteOneUseAcrossInstances(t *testing.T) {
	url := pgtest.NewDatabase(t)
	dbs := []*postgres.DB{open(t, url), open(t, url)}
	inv := newInvite("inv_race", 1)
	if err := dbs[0].CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	got := redeemInParallel(t, dbs, inv.Hash, 20, func(i int) string { return fmt.Sprintf("user%d@example.com", i) })
	if got[invites.InviteRedeemed] != 1 || got[invites.InviteUsedUp] != 19 {
		t.Errorf("outcomes %v, want 1 redeemed and 19 used up", got)
	}
	if stored, err := dbs[1].InviteByHash(inv.Hash); err != nil || stored.Used != 1 {
		t.Errorf("stored %+v, %v; want 1 use", stored, err)
	}
}

// One e-mail redeeming a many-use code from both instances at once takes
// one use: the others are told it already redeemed, not an error.
func TestInviteSameEmailAcrossInstances(t *testing.T) {
	url := pgtest.NewDatabase(t)
	dbs := []*postgres.DB{open(t, url), open(t, url)}
	inv := newInvite("inv_many", 100)
	if err := dbs[0].CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	got := redeemInParallel(t, dbs, inv.Hash, 20, func(int) string { return "same@example.com" })
	if got[invites.InviteRedeemed] != 1 || got[invites.InviteAlreadyRedeemed] != 19 {
		t.Errorf("outcomes %v, want 1 redeemed and 19 already redeemed", got)
	}
	// And 30 e-mails on 25 uses: exactly 25 in.
	few := newInvite("inv_few", 25)
	if err := dbs[1].CreateInvite(few); err != nil {
		t.Fatal(err)
	}
	got = redeemInParallel(t, dbs, few.Hash, 30, func(i int) string { return fmt.Sprintf("u%d@x", i) })
	if got[invites.InviteRedeemed] != 25 || got[invites.InviteUsedUp] != 5 {
		t.Errorf("outcomes %v, want 25 redeemed and 5 used up", got)
	}
}

func TestInviteListRevokeDelete(t *testing.T) {
	db := newDB(t)
	a, b := newInvite("inv_a", 1), newInvite("inv_b", 1)
	b.CreatedAt = t0.Add(-time.Hour)
	b.ExpiresAt = t0.Add(time.Hour)
	for _, inv := range []invites.Invite{a, b} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
	}
	for name, inv := range map[string]invites.Invite{
		"same id":   {ID: "inv_a", Hash: sha256.Sum256([]byte("other")), MaxUses: 1, CreatedAt: t0},
		"same hash": {ID: "inv_c", Hash: a.Hash, MaxUses: 1, CreatedAt: t0},
	} {
		if err := db.CreateInvite(inv); !errors.Is(err, postgres.ErrExists) {
			t.Errorf("%s: CreateInvite = %v, want ErrExists", name, err)
		}
	}
	for name, inv := range map[string]invites.Invite{
		"no id": {Hash: a.Hash, MaxUses: 1, CreatedAt: t0}, "no hash": {ID: "x", MaxUses: 1, CreatedAt: t0},
		"no uses": {ID: "x", Hash: sha256.Sum256([]byte("x")), CreatedAt: t0}, "no time": {ID: "x", Hash: sha256.Sum256([]byte("x")), MaxUses: 1},
		"used": {ID: "x", Hash: sha256.Sum256([]byte("x")), MaxUses: 1, CreatedAt: t0, Used: 1},
	} {
		if err := db.CreateInvite(inv); !errors.Is(err, postgres.ErrInvalid) {
			t.Errorf("%s: CreateInvite = %v, want ErrInvalid", name, err)
		}
	}
	list, err := db.Invites()
	if err != nil || len(list) != 2 || list[0] != b || list[1] != a {
		t.Fatalf("Invites() = %+v, %v; want b then a as stored", list, err)
	}
	at := t0.Add(time.Minute)
	if inv, err := db.RevokeInvite("inv_a", at); err != nil || !inv.RevokedAt.Equal(at) {
		t.Errorf("RevokeInvite = %+v, %v", inv, err)
	}
	if inv, err := db.RevokeInvite("inv_a", at.Add(time.Hour)); err != nil || !inv.RevokedAt.Equal(at) {
		t.Errorf("second RevokeInvite = %+v, %v; want the first time kept", inv, err)
	}
	if _, err := db.RevokeInvite("inv_none", at); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("RevokeInvite(unknown) = %v, want invites.ErrNotFound", err)
	}
	if o, err := db.RedeemInvite(context.Background(), b.Hash, "a@x", t0); err != nil || o != invites.InviteRedeemed {
		t.Fatalf("redeem b: %v, %v", o, err)
	}
	if inv, err := db.DeleteInvite("inv_b"); err != nil || inv.ID != "inv_b" || inv.Used != 1 {
		t.Errorf("DeleteInvite = %+v, %v", inv, err)
	}
	if _, err := db.DeleteInvite("inv_b"); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("second DeleteInvite = %v, want invites.ErrNotFound", err)
	}
	// A new invite under the deleted one's hash starts without its e-mails.
	if err := db.CreateInvite(b); err != nil {
		t.Fatal(err)
	}
	if o, err := db.RedeemInvite(context.Background(), b.Hash, "a@x", t0); err != nil || o != invites.InviteRedeemed {
		t.Errorf("redeem of the recreated invite = %v, %v; want redeemed", o, err)
	}
	list, _ = db.Invites()
	if ids := []string{list[0].ID, list[1].ID}; !slices.Equal(ids, []string{"inv_b", "inv_a"}) {
		t.Errorf("Invites() after delete and create = %v", ids)
	}
}

// An invite copied from bolt keeps its use count and its e-mails; a
// second copy copies nothing.
func TestImportInvite(t *testing.T) {
	db := newDB(t)
	inv := newInvite("inv_old", 3)
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
