package admin

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"breakwater/detect"
)

// ServiceRefusalReader sums the refusals of every instance that shares a
// database, by layer, from the statistics events they wrote:
// storage/postgres.
type ServiceRefusalReader interface {
	LayerRefusals(from, to time.Time) ([]detect.LayerRefusals, error)
}

// serviceRefusalsTTL is how long the service's refusals are kept before
// the next scrape or dashboard reads them again: a few seconds, so that
// neither costs more than one query in that time.
const serviceRefusalsTTL = 5 * time.Second

// serviceRefusals holds today's refusals of the service, read at most
// once per serviceRefusalsTTL.
type serviceRefusals struct {
	read  ServiceRefusalReader
	day   func(time.Time) (from, to time.Time)
	warn  func(error)
	mu    sync.Mutex // held while reading: concurrent callers share one query
	until time.Time
	from  time.Time
	rows  []detect.LayerRefusals
	err   error
}

// today returns today's refusals of the service at now, from the cache
// while it is fresh and of the same day.
func (c *serviceRefusals) today(now time.Time) ([]detect.LayerRefusals, error) {
	from, to := c.day(now)
	c.mu.Lock()
	defer c.mu.Unlock()
	if now.Before(c.until) && from.Equal(c.from) {
		return c.rows, c.err
	}
	c.rows, c.err = c.read.LayerRefusals(from, to)
	c.from, c.until = from, now.Add(serviceRefusalsTTL)
	if c.err != nil {
		c.warn(c.err)
	}
	return c.rows, c.err
}

// observeService exports, when r is set (several instances), today's
// refusals of the service beside this instance's, cached
// serviceRefusalsTTL; a failed read is logged at most once a minute.
func (s *Server) observeService(r ServiceRefusalReader) {
	if r == nil {
		return
	}
	loc := s.d.Operator.Location()
	s.serviceRefusals = &serviceRefusals{
		read: r,
		day: func(now time.Time) (time.Time, time.Time) {
			from, to, _ := detect.DayBounds(s.calendar.Day(now), loc) // a day the calendar made
			return from, to
		},
		warn: func(err error) {
			if ok, held := s.serviceLog.Allow(s.now(), time.Minute); ok {
				s.log.Warn("the service's refusals not read: /metrics and the dashboard show this instance's only", "err", err, "held_back", held)
			}
		},
	}
	s.edge.Metrics().Registry().MustRegister(newServiceRefusalCollector(func() ([]detect.LayerRefusals, error) {
		return s.serviceRefusals.today(s.now())
	}))
}

// serviceRefusalCollector exports today's refusals of the service as
// gauges read at scrape time; none while they cannot be read.
type serviceRefusalCollector struct {
	rows            func() ([]detect.LayerRefusals, error)
	refused, shadow *prometheus.Desc
}

func newServiceRefusalCollector(rows func() ([]detect.LayerRefusals, error)) serviceRefusalCollector {
	return serviceRefusalCollector{
		rows: rows,
		refused: prometheus.NewDesc("breakwater_service_refusals_today",
			"Requests refused today by a layer, by every instance of the service (the statistics events in the shared database, up to a minute behind), by layer.",
			[]string{"layer"}, nil),
		shadow: prometheus.NewDesc("breakwater_service_shadow_refusals_today",
			"Requests a layer in shadow mode would have refused today, by every instance of the service, by layer.",
			[]string{"layer"}, nil),
	}
}

func (c serviceRefusalCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.refused
	ch <- c.shadow
}

func (c serviceRefusalCollector) Collect(ch chan<- prometheus.Metric) {
	rows, err := c.rows()
	if err != nil {
		return
	}
	for _, r := range rows {
		d := c.refused
		if r.Shadow {
			d = c.shadow
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(r.Count), r.Layer)
	}
}

// ServiceRefusalRow is one layer's row of the dashboard's table of the
// service's refusals. The would-be refusals in shadow mode are the
// dashboard's shadow table, read as breakwater usage reads them.
type ServiceRefusalRow struct {
	Layer   string
	Refused int64
}

// serviceRefusalRows folds the refusals of rows into one row per layer, in
// layer order.
func serviceRefusalRows(rows []detect.LayerRefusals) []ServiceRefusalRow {
	var out []ServiceRefusalRow
	for _, r := range rows { // ordered by layer
		if r.Shadow {
			continue
		}
		if len(out) == 0 || out[len(out)-1].Layer != r.Layer {
			out = append(out, ServiceRefusalRow{Layer: r.Layer})
		}
		out[len(out)-1].Refused += r.Count
	}
	return out
}
