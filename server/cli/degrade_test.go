package cli

import (
	"strings"
	"testing"

	"breakwater/server/operator"
)

// breakwater budget says whether reads are degraded and counts today's
// reads per model, on one line.
func TestPrintBudgetModels(t *testing.T) {
	var out strings.Builder
	b := operator.BudgetInfo{Day: "2026-12-03", Month: "2026-12", DegradedBy: "soft_daily_usd",
		ReadsByModel: map[string]int64{"gemini-3.5-flash-lite": 5, "gemini-2.5-flash-lite": 3}}
	if err := printBudget(&out, false, b); err != nil {
		t.Fatal(err)
	}
	want := "FALLBACK above soft_daily_usd  reads today: gemini-2.5-flash-lite 3, gemini-3.5-flash-lite 5"
	if !strings.Contains(strings.Join(strings.Fields(out.String()), " "), strings.Join(strings.Fields(want), " ")) {
		t.Errorf("breakwater budget:\n%s\nwant a line with %q", out.String(), want)
	}
	out.Reset()
	if err := printBudget(&out, true, b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"degraded_by": "soft_daily_usd"`) || !strings.Contains(out.String(), `"gemini-2.5-flash-lite": 3`) {
		t.Errorf("breakwater budget --json:\n%s", out.String())
	}
}
