package postgres_test

import (
	"context"
	"crypto/sha256"
	"testing"
	"time"

	"breakwater/detect"
	"breakwater/server/invites"
)

// PrunePersonal deletes, before the cut, the IPs and e-mails of the
// aggregates (keeping the per-user figures), the findings, and the
// e-mails of spent invites; it keeps a redeemable invite's e-mails and
// everything after the cut.
func TestPrunePersonal(t *testing.T) {
	db := newDB(t)
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
	n, err := db.PrunePersonal("2026-02-01", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), recent)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 { // one aggregate stripped, one day of findings, one e-mail
		t.Errorf("PrunePersonal changed %d records, want 3", n)
	}
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
	if red, err := db.Redemptions(spent); err != nil || len(red) != 0 {
		t.Errorf("the spent invite's redemptions: %v %v, want none", red, err)
	}
	if red, err := db.Redemptions(live); err != nil || len(red) != 1 {
		t.Errorf("the live invite's redemptions: %v %v, want its one e-mail", red, err)
	}
	if inv, err := db.InviteByHash(spent); err != nil || inv.Used != 1 {
		t.Errorf("the spent invite's use count: %+v %v, want 1", inv, err)
	}
	// Once spent, the e-mail may not take the invite again.
	if o, err := db.RedeemInvite(context.Background(), spent, "old@example.com", recent); err != nil || o != invites.InviteUsedUp {
		t.Errorf("redeem of the spent invite after pruning = %v, %v; want used up", o, err)
	}
	// Run again: nothing left to prune.
	if n, err := db.PrunePersonal("2026-02-01", time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), recent); err != nil || n != 0 {
		t.Errorf("second PrunePersonal = %d, %v; want 0", n, err)
	}
	if _, err := db.PrunePersonal("Feb", recent, recent); err == nil {
		t.Error("PrunePersonal accepted a bad day")
	}
}
