package backendtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/server/invites"
)

// Personal checks detect.PersonalPruner: before the cut it deletes the IPs
// and e-mails of the aggregates (keeping the per-user figures), the
// findings, and the e-mails of spent invites; it keeps a redeemable
// invite's e-mails and everything after the cut; a spent invite stays
// spent, a second run finds nothing, a bad day is refused.
func Personal(t *testing.T, kit Kit) {
	db := kit.Open(t)
	old := time.Date(2026, 1, 5, 12, 0, 0, 0, time.UTC)
	recent := old.AddDate(0, 0, 40)
	for _, day := range []string{"2026-01-05", "2026-02-14"} {
		stats := detect.DayStats{Day: day, Users: map[string]detect.UserDay{"u1": {}}, IPs: map[string]detect.IPDay{"192.0.2.1": {}},
			Emails: map[string]detect.IPDay{"someone@example.com": {}}}
		if err := db.SaveDetection(stats, []detect.Finding{{Day: day, Detector: "invite_bruteforce", Subject: "someone@example.com"}}, detect.RunRecord{Day: day}); err != nil {
			t.Fatal(err)
		}
	}
	spent, live := sha256.Sum256([]byte("SPENT")), sha256.Sum256([]byte("LIVE"))
	for _, inv := range []invites.Invite{{ID: "inv_spent", Hash: spent, MaxUses: 1, CreatedAt: old}, {ID: "inv_live", Hash: live, MaxUses: 5, CreatedAt: old}} {
		if err := db.CreateInvite(inv); err != nil {
			t.Fatal(err)
		}
		if _, err := db.RedeemInvite(context.Background(), inv.Hash, "old@example.com", old); err != nil {
			t.Fatal(err)
		}
	}
	cut := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	n, err := db.PrunePersonal("2026-02-01", cut, recent)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 { // one aggregate stripped, one day of findings, one e-mail
		t.Errorf("PrunePersonal changed %d records, want 3", n)
	}
	checkPruned(t, kit, db, spent, live)
	if o, err := db.RedeemInvite(context.Background(), spent, "old@example.com", recent); err != nil || o != invites.InviteUsedUp {
		t.Errorf("redeem of the spent invite after pruning = %v, %v; want used up", o, err)
	}
	if n, err := db.PrunePersonal("2026-02-01", cut, recent); err != nil || n != 0 {
		t.Errorf("second PrunePersonal = %d, %v; want 0", n, err)
	}
	if _, err := db.PrunePersonal("Feb", recent, recent); err == nil {
		t.Error("PrunePersonal accepted a bad day")
	}
}

// checkPruned checks what Personal's first prune left.
func checkPruned(t *testing.T, kit Kit, db Backend, spent, live [32]byte) {
	t.Helper()
	stats, err := db.DayStats("2026-01-01", "2026-03-01")
	if err != nil || len(stats) != 2 {
		t.Fatalf("DayStats = %v, %v", stats, err)
	}
	if s := stats[0]; s.IPs != nil || s.Emails != nil || len(s.Users) != 1 {
		t.Errorf("the old aggregate: IPs %v, e-mails %v, users %v; want only the users", s.IPs, s.Emails, s.Users)
	}
	if s := stats[1]; len(s.IPs) != 1 || len(s.Emails) != 1 {
		t.Errorf("the recent aggregate lost its figures: %+v", s)
	}
	findings, err := db.Findings("2026-01-01", "2026-03-01")
	if err != nil || len(findings) != 1 || findings[0].Day != "2026-02-14" {
		t.Errorf("findings after pruning: %v %v; want only 2026-02-14's", findings, err)
	}
	if red, err := kit.Redemptions(db, spent); err != nil || len(red) != 0 {
		t.Errorf("the spent invite's redemptions: %v %v, want none", red, err)
	}
	if red, err := kit.Redemptions(db, live); err != nil || len(red) != 1 {
		t.Errorf("the live invite's redemptions: %v %v, want its one e-mail", red, err)
	}
	if inv, err := db.InviteByHash(spent); err != nil || inv.Used != 1 {
		t.Errorf("the spent invite's use count: %+v %v, want 1", inv, err)
	}
}

// Rekey checks RekeyInvites: it moves every invite and its redemptions to
// the keyed hash once; again with the same mark it does nothing, and with
// another mark it refuses and moves nothing.
func Rekey(t *testing.T, kit Kit) {
	db := kit.Open(t)
	old := sha256.Sum256([]byte("CODE"))
	if err := db.CreateInvite(invites.Invite{ID: "inv_a", Hash: old, MaxUses: 3, CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.RedeemInvite(context.Background(), old, "a@example.com", t0); err != nil {
		t.Fatal(err)
	}
	keyed := RekeyForTest(old)
	for i, want := range []int{1, 0} {
		if n, err := db.RekeyInvites([]byte("mark-1"), RekeyForTest); err != nil || n != want {
			t.Fatalf("RekeyInvites #%d = %d, %v; want %d", i+1, n, err, want)
		}
	}
	if _, err := db.InviteByHash(old); !errors.Is(err, invites.ErrNotFound) {
		t.Errorf("the unkeyed hash still finds the invite: %v", err)
	}
	inv, err := db.InviteByHash(keyed)
	if err != nil || inv.ID != "inv_a" || inv.Hash != keyed || inv.Used != 1 {
		t.Errorf("InviteByHash(keyed) = %+v, %v", inv, err)
	}
	if out, err := db.CheckInvite(keyed, "a@example.com", t0); err != nil || out != invites.InviteAlreadyRedeemed {
		t.Errorf("the redemption did not move with it: %v %v", out, err)
	}
	if _, err := db.RekeyInvites([]byte("mark-2"), RekeyForTest); !errors.Is(err, kit.ErrInviteKeyChanged) {
		t.Errorf("another mark: %v, want ErrInviteKeyChanged", err)
	}
	if _, err := db.InviteByHash(keyed); err != nil {
		t.Errorf("another mark moved the invite: %v", err)
	}
}

// RekeyForTest is the re-keying Rekey uses, for a backend's own tests of
// it (several instances): a plain hash of a prefix and the digest.
func RekeyForTest(d [32]byte) [32]byte { return sha256.Sum256(append([]byte("k:"), d[:]...)) }
