package edge

import (
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestCounterTable: a label set's counter is the vector's own, found again
// without allocating, and label sets past the table's bound still count.
func TestCounterTable(t *testing.T) {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t_total", Help: "t"}, []string{"n"})
	table := newCounterTable(vec, func(n int) []string { return []string{strconv.Itoa(n)} })
	for n := range maxCounterTable + 10 {
		table.get(n).Inc()
		table.get(n).Inc()
	}
	for _, n := range []int{0, 7, maxCounterTable - 1, maxCounterTable, maxCounterTable + 9} {
		var m dto.Metric
		if err := vec.WithLabelValues(strconv.Itoa(n)).Write(&m); err != nil {
			t.Fatal(err)
		}
		if got := m.GetCounter().GetValue(); got != 2 {
			t.Errorf("label %d: %v, want 2", n, got)
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { table.get(7).Inc() }); allocs != 0 {
		t.Errorf("a known label set: %v allocations, want 0", allocs)
	}
}
