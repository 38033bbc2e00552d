package admin

import "testing"

func TestChartScales(t *testing.T) {
	for _, c := range []struct{ n, even, nice int64 }{
		{0, 2, 1}, {1, 2, 1}, {3, 4, 5}, {4, 4, 5}, {5, 10, 5}, {11, 20, 20}, {600, 1000, 1000}, {150, 200, 200},
	} {
		if got := evenCeil(c.n); got != c.even {
			t.Errorf("evenCeil(%d) = %d, want %d", c.n, got, c.even)
		}
		if got := niceCeil(c.n); got != c.nice {
			t.Errorf("niceCeil(%d) = %d, want %d", c.n, got, c.nice)
		}
	}
}
