package reconcile

import (
	"math"
	"slices"
)

// suggest sets, on the lines of each model whose drift is steady (every
// day's within maxDrift of the others', and beyond maxDrift) and whose
// cause is the price, the prices that would make the ledger agree: from
// the bill's input and output rows over the tokens the ledger counted
// when the bill splits them, else the price in force scaled by the
// drift.
func suggest(lines []Line, maxDrift float64, prices Prices) {
	byModel := map[string][]int{}
	var order []string
	for i, l := range lines {
		if l.Kind != KindModel || l.Drift == nil || l.BilledUSD == 0 {
			continue
		}
		if byModel[l.Model] == nil {
			order = append(order, l.Model)
		}
		byModel[l.Model] = append(byModel[l.Model], i)
	}
	for _, model := range order {
		idx := byModel[model]
		in, out, ok := suggestion(lines, idx, maxDrift, prices)
		if !ok {
			continue
		}
		for _, i := range idx {
			lines[i].SuggestedInput, lines[i].SuggestedOutput = &in, &out
		}
	}
}

// suggestion is the prices for one model's lines (by index), ok false
// when its drift is not steady, within bounds, or caused by tokens.
func suggestion(lines []Line, idx []int, maxDrift float64, prices Prices) (in, out float64, ok bool) {
	var drifts []float64
	split := true
	var inTokens, outTokens, inMicro, outMicro int64
	for _, i := range idx {
		l := lines[i]
		if l.Cause == CauseTokens {
			return 0, 0, false
		}
		drifts = append(drifts, *l.Drift)
		if l.BilledInputTokens == nil || l.BilledOutputTokens == nil {
			split = false
		}
		inTokens += l.InputTokens
		outTokens += l.OutputTokens
		inMicro += l.billedInMicro
		outMicro += l.billedOutMicro
	}
	lo, hi := slices.Min(drifts), slices.Max(drifts)
	mean := 0.0
	for _, d := range drifts {
		mean += d
	}
	mean /= float64(len(drifts))
	if hi-lo > maxDrift || math.Abs(mean) <= maxDrift {
		return 0, 0, false
	}
	if split && inTokens > 0 && outTokens > 0 {
		// Micro-dollars per token are dollars per million tokens.
		return round6(float64(inMicro) / float64(inTokens)), round6(float64(outMicro) / float64(outTokens)), true
	}
	if prices == nil {
		return 0, 0, false
	}
	last := lines[idx[len(idx)-1]]
	pin, pout, known := prices(last.Model, last.Day)
	if !known {
		return 0, 0, false
	}
	return round6(pin * (1 + mean)), round6(pout * (1 + mean)), true
}

// round6 rounds to a millionth, as prices are written.
func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }
