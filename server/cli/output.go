package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"breakwater/server/operator"
)

// printOut prints v as JSON, or as a table whose rows fill calls.
func printOut(w io.Writer, asJSON bool, v any, header string, fill func(row func(...any))) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	fill(func(cells ...any) {
		for i, c := range cells {
			if i > 0 {
				fmt.Fprint(tw, "\t")
			}
			fmt.Fprint(tw, c)
		}
		fmt.Fprintln(tw)
	})
	return tw.Flush()
}

// orDash formats t for a table, "-" for the zero time.
func orDash(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}

// limitText is a count limit for a table, "off" for 0.
func limitText(n int64) string {
	if n == 0 {
		return "off"
	}
	return strconv.FormatInt(n, 10)
}

// usdText is a money limit for a table, "off" for 0: as configured,
// never rounded (operator.FormatUSD).
func usdText(v float64) string {
	if v == 0 {
		return "off"
	}
	return operator.FormatUSD(v)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
