package detect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryAlertKindDocumented: docs/OPERATIONS.md shows, for every kind,
// what its alert says to do, and the upstream alerts' summaries.
func TestEveryAlertKindDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "docs", "OPERATIONS.md"))
	if err != nil {
		t.Fatal(err)
	}
	for kind, lines := range actions {
		if !strings.Contains(string(doc), "`"+kind+"`") {
			t.Errorf("docs/OPERATIONS.md does not name %s", kind)
		}
		for _, line := range lines {
			if !strings.Contains(string(doc), line) {
				t.Errorf("docs/OPERATIONS.md does not show what %s says to do: %q", kind, line)
			}
		}
	}
	for kind, summary := range upstreamSummaries {
		if !strings.Contains(string(doc), summary) {
			t.Errorf("docs/OPERATIONS.md does not show the summary of %s: %q", kind, summary)
		}
	}
	for _, summary := range []string{DegradedSummary("soft_daily_requests", "gemini-2.5-flash-lite"), RestoredSummary("gemini-3.5-flash-lite")} {
		if !strings.Contains(string(doc), summary) {
			t.Errorf("docs/OPERATIONS.md does not show the summary %q", summary)
		}
	}
	for _, line := range warnActions("daily_usd") {
		if !strings.Contains(string(doc), strings.ReplaceAll(line, "daily_usd", "daily_requests")) {
			t.Errorf("docs/OPERATIONS.md does not show what an early warning says to do: %q", line)
		}
	}
}
