package backendtest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"breakwater/server/invites"
)

// redeemInParallel redeems hash from n goroutines released together,
// spread over dbs, the i-th with the e-mail email(i); it returns the
// outcomes counted and who was told redeemed.
func redeemInParallel(t *testing.T, dbs []Backend, hash [32]byte, n int, email func(int) string) (map[invites.RedeemOutcome]int, map[string]bool) {
	t.Helper()
	var mu sync.Mutex
	got, winners := map[invites.RedeemOutcome]int{}, map[string]bool{}
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
			defer mu.Unlock()
			got[o]++
			if o == invites.InviteRedeemed {
				if winners[email(i)] {
					t.Errorf("%s redeemed twice", email(i))
				}
				winners[email(i)] = true
			}
		})
	}
	close(start)
	wg.Wait()
	return got, winners
}

// twoInstances opens a backend and another handle on it.
func twoInstances(t *testing.T, kit Kit) []Backend {
	db := kit.Open(t)
	return []Backend{db, kit.Another(t, db)}
}

// oneUseInParallel: a one-use code redeemed by 20 e-mails at once lets
// exactly one in.
func oneUseInParallel(t *testing.T, kit Kit) {
	dbs := twoInstances(t, kit)
	inv := NewInvite("inv_race", 1)
	if err := dbs[0].CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	got, _ := redeemInParallel(t, dbs, inv.Hash, 20, func(i int) string { return fmt.Sprintf("user%d@example.com", i) })
	if got[invites.InviteRedeemed] != 1 || got[invites.InviteUsedUp] != 19 {
		t.Errorf("outcomes %v, want 1 redeemed and 19 used up", got)
	}
	if stored, err := dbs[1].InviteByHash(inv.Hash); err != nil || stored.Used != 1 {
		t.Errorf("stored %+v, %v; want 1 use", stored, err)
	}
}

// sameEmailInParallel: one e-mail redeeming a many-use code 20 times at
// once takes one use, the others told it already redeemed (not an
// error); 30 e-mails on 25 uses: exactly 25 in.
func sameEmailInParallel(t *testing.T, kit Kit) {
	dbs := twoInstances(t, kit)
	inv := NewInvite("inv_many", 100)
	if err := dbs[0].CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	got, _ := redeemInParallel(t, dbs, inv.Hash, 20, func(int) string { return "same@example.com" })
	if got[invites.InviteRedeemed] != 1 || got[invites.InviteAlreadyRedeemed] != 19 {
		t.Errorf("outcomes %v, want 1 redeemed and 19 already redeemed", got)
	}
	few := NewInvite("inv_few", 25)
	if err := dbs[1].CreateInvite(few); err != nil {
		t.Fatal(err)
	}
	got, _ = redeemInParallel(t, dbs, few.Hash, 30, func(i int) string { return fmt.Sprintf("u%d@x", i) })
	if got[invites.InviteRedeemed] != 25 || got[invites.InviteUsedUp] != 5 {
		t.Errorf("outcomes %v, want 25 redeemed and 5 used up", got)
	}
}

// manyUsesInParallel: a code with N uses raced by many e-mails, each of
// them several times at once, is redeemed by exactly N e-mails, and the
// stored count, the stored e-mails and the outcomes agree.
func manyUsesInParallel(t *testing.T, kit Kit) {
	const uses, emails, tries = 5, 40, 3
	dbs := twoInstances(t, kit)
	inv := NewInvite("inv_race_many", uses)
	if err := dbs[0].CreateInvite(inv); err != nil {
		t.Fatal(err)
	}
	got, winners := redeemInParallel(t, dbs, inv.Hash, emails*tries, func(i int) string { return fmt.Sprintf("user%d@example.com", i%emails) })
	if got[invites.InviteRedeemed] != uses || got[invites.InviteRedeemed]+got[invites.InviteAlreadyRedeemed]+got[invites.InviteUsedUp] != emails*tries {
		t.Errorf("outcomes %v, want %d redeemed and the rest already redeemed or used up", got, uses)
	}
	if n, want := got[invites.InviteAlreadyRedeemed], uses*(tries-1); n != want {
		t.Errorf("%d already redeemed, want %d (the winners' other tries)", n, want)
	}
	if stored, err := dbs[0].InviteByHash(inv.Hash); err != nil || stored.Used != uses {
		t.Errorf("stored %+v, %v; want %d uses", stored, err, uses)
	}
	reds, err := kit.Redemptions(dbs[0], inv.Hash)
	if err != nil || len(reds) != uses {
		t.Fatalf("%d stored redemptions (%v), want %d", len(reds), err, uses)
	}
	for _, r := range reds {
		if !winners[r.Email] {
			t.Errorf("stored redemption by %s, who was not told redeemed", r.Email)
		}
	}
}
