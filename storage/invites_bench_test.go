package storage

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"breakwater/server/invites"
	"breakwater/storage/backendtest"
)

// BenchmarkInviteRedeemManyUses redeems one multi-use code redeemUses
// times, by a different e-mail each time and one after the other (one
// transaction each, as single requests arrive), and reports the mean cost
// of a redemption over the first and the last redeemWindow of them, and
// last/first. A ratio near 1 means a redemption costs the same however
// many came before it.
//
// "nosync" skips fsync so that what is measured is the work done inside
// the write transaction, which every other writer waits for; "fsync" is
// the production setting and is slow: run it with -benchtime=1x. Compare
// ratios within one run, not absolute times across machines.
func BenchmarkInviteRedeemManyUses(b *testing.B) {
	const redeemUses, redeemWindow = 5000, 500
	for _, mode := range []struct {
		name   string
		noSync bool
	}{{"nosync", true}, {"fsync", false}} {
		b.Run(mode.name, func(b *testing.B) {
			db := mustOpenPath(b, filepath.Join(b.TempDir(), "bench.db"), Options{NoSync: mode.noSync})
			ctx := context.Background()
			var first, last time.Duration
			runs := 0
			for b.Loop() {
				inv := backendtest.NewInvite(fmt.Sprintf("inv_bench%d", runs), redeemUses)
				if err := db.CreateInvite(inv); err != nil {
					b.Fatal(err)
				}
				for i := range redeemUses {
					start := time.Now()
					o, err := db.RedeemInvite(ctx, inv.Hash, fmt.Sprintf("user%05d@example.com", i), t0)
					took := time.Since(start)
					if err != nil || o != invites.InviteRedeemed {
						b.Fatalf("redemption %d: %v %v", i, o, err)
					}
					switch {
					case i < redeemWindow:
						first += took
					case i >= redeemUses-redeemWindow:
						last += took
					}
				}
				runs++
			}
			perFirst := float64(first.Nanoseconds()) / float64(runs*redeemWindow)
			perLast := float64(last.Nanoseconds()) / float64(runs*redeemWindow)
			b.ReportMetric(perFirst, "ns/redeem-first")
			b.ReportMetric(perLast, "ns/redeem-last")
			b.ReportMetric(perLast/perFirst, "last/first")
			b.Logf("%d redemptions of one code, %d run(s): first %d %.0f ns each, last %d %.0f ns each, ratio %.2f",
				redeemUses, runs, redeemWindow, perFirst, redeemWindow, perLast, perLast/perFirst)
		})
	}
}
