package reconcile

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
)

// compareDay makes a day's lines: one per model counted or billed, the
// unattributed and the unmatched, then the day's total, last. None when
// the day has neither ledger nor bill. billedNoLedger is a day Google
// billed that the ledger holds no call of.
func compareDay(day string, ld LedgerDay, counted map[string]*Counted, bd *billDay, maxDrift float64) (lines []Line, billedNoLedger bool) {
	if bd == nil {
		bd = &billDay{}
	}
	models := map[string]bool{}
	for m := range counted {
		models[m] = true
	}
	for m := range bd.models {
		models[m] = true
	}
	var attributed, billedTotal int64
	for _, model := range slices.Sorted(maps.Keys(models)) {
		c, bm := counted[model], bd.models[model]
		if c == nil {
			c = &Counted{}
		}
		if bm == nil {
			bm = &billed{}
		}
		attributed += c.CostMicroUSD
		billedTotal += bm.costMicro
		lines = append(lines, modelLine(day, model, c, bm, maxDrift))
	}
	if rest := ld.SpendMicroUSD - attributed; rest != 0 {
		lines = append(lines, Line{Day: day, Model: Unattributed, Kind: KindUnattributed, CountedUSD: usd(rest),
			Note: "calls without a usage row: failed, withheld, or open at their worst case"})
	}
	if len(bd.unmatched) > 0 {
		var sum int64
		var descs []string
		for _, desc := range slices.Sorted(maps.Keys(bd.unmatched)) {
			sum += bd.unmatched[desc]
			descs = append(descs, fmt.Sprintf("%q $%.6f", desc, usd(bd.unmatched[desc])))
		}
		billedTotal += sum
		lines = append(lines, Line{Day: day, Model: Unmatched, Kind: KindUnmatched, BilledUSD: usd(sum),
			Note: "rows that name no known model (add a [[reconcile.sku]]): " + strings.Join(descs, ", ")})
	}
	if ld.SpendMicroUSD == 0 && billedTotal == 0 && len(lines) == 0 && bd.credits == 0 && len(bd.other) == 0 {
		return nil, false
	}
	total := Line{Day: day, Model: AllModels, Kind: KindDay, CountedUSD: usd(ld.SpendMicroUSD), BilledUSD: usd(billedTotal),
		Drift: drift(ld.SpendMicroUSD, billedTotal), CreditsUSD: usd(bd.credits)}
	total.Beyond = beyond(total.Drift, maxDrift)
	if ld.SpendMicroUSD == 0 && billedTotal > 0 {
		total.Beyond, billedNoLedger = true, true
		total.Note = "billed, and no call in the ledger"
	}
	for cur, v := range bd.other {
		if total.OtherCurrencies == nil {
			total.OtherCurrencies = map[string]float64{}
		}
		total.OtherCurrencies[cur] = usd(v)
	}
	return append(lines, total), billedNoLedger
}

// modelLine compares one model's day.
func modelLine(day, model string, c *Counted, bm *billed, maxDrift float64) Line {
	l := Line{Day: day, Model: model, Kind: KindModel, CountedUSD: usd(c.CostMicroUSD), BilledUSD: usd(bm.costMicro),
		Drift: drift(c.CostMicroUSD, bm.costMicro), Reads: c.Reads, InputTokens: c.InputTokens, OutputTokens: c.OutputTokens}
	l.Beyond = beyond(l.Drift, maxDrift)
	if bm.in.rows > 0 {
		l.BilledInputTokens = &bm.in.tokens
	}
	if bm.out.rows > 0 {
		l.BilledOutputTokens = &bm.out.tokens
	}
	l.billedInMicro, l.billedOutMicro = bm.in.costMicro, bm.out.costMicro
	if !l.Beyond {
		return l
	}
	l.Cause = CausePrice
	var off []string
	for _, s := range []struct {
		name    string
		counted int64
		billed  *float64
	}{{"input", c.InputTokens, l.BilledInputTokens}, {"output", c.OutputTokens, l.BilledOutputTokens}} {
		if s.billed != nil && tokensDiffer(float64(s.counted), *s.billed, maxDrift) {
			off = append(off, fmt.Sprintf("Google billed %.0f %s tokens, Breakwater counted %d", *s.billed, s.name, s.counted))
		}
	}
	if len(off) > 0 {
		l.Cause = CauseTokens
		l.Note = strings.Join(off, "; ")
		if l.BilledOutputTokens != nil && *l.BilledOutputTokens > float64(c.OutputTokens) {
			l.Note += " (thinking tokens not counted?)"
		}
	}
	return l
}

// tokensDiffer reports whether two token counts differ by more than the
// share max of the larger.
func tokensDiffer(a, b, max float64) bool {
	return math.Abs(a-b) > max*math.Max(a, b)+0.5
}
