package server

import (
	"context"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/server/operator"
)

//go:embed web/dashboard.html
var webFS embed.FS

var dashboardPage = template.Must(template.New("dashboard.html").Funcs(template.FuncMap{
	"usd": func(v float64) string { return fmt.Sprintf("$%.4f", v) },
}).ParseFS(webFS, "web/dashboard.html"))

// dashboardData is everything the dashboard shows.
type dashboardData struct {
	Now      string
	Zone     string
	Budget   operator.BudgetInfo
	Refusals []refusalCount
	TopUsers []operator.UsageInfo
	Findings []string
	Days     []budget.LedgerDay
	Chart    template.HTML // inline SVG drawn here, from numbers only
}

type refusalCount struct {
	Layer, Reason string
	Count         int64
	Shadow        int64 // would-be refusals of the layer in shadow mode
}

// withShadow lists real and shadow refusals side by side, one row per
// layer and reason.
func withShadow(real, shadow []refusalCount) []refusalCount {
	out := append([]refusalCount(nil), real...)
	for _, sh := range shadow {
		i := slices.IndexFunc(out, func(r refusalCount) bool { return r.Layer == sh.Layer && r.Reason == sh.Reason })
		if i < 0 {
			out = append(out, refusalCount{Layer: sh.Layer, Reason: sh.Reason})
			i = len(out) - 1
		}
		out[i].Shadow = sh.Count
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Layer != out[j].Layer {
			return out[i].Layer < out[j].Layer
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// dailyRefusals counts refusals by layer and reason for the current day,
// for the dashboard (the metrics count since start).
type dailyRefusals struct {
	mu     sync.Mutex
	day    string
	counts map[[2]string]int64
}

func (d *dailyRefusals) add(day, layer, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if day != d.day {
		d.day, d.counts = day, map[[2]string]int64{}
	}
	d.counts[[2]string{layer, reason}]++
}

func (d *dailyRefusals) list(day string) []refusalCount {
	d.mu.Lock()
	defer d.mu.Unlock()
	if day != d.day {
		return nil
	}
	out := make([]refusalCount, 0, len(d.counts))
	for k, n := range d.counts {
		out = append(out, refusalCount{Layer: k[0], Reason: k[1], Count: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Layer != out[j].Layer {
			return out[i].Layer < out[j].Layer
		}
		return out[i].Reason < out[j].Reason
	})
	return out
}

// dashboard gathers the dashboard's figures.
func (s *Server) dashboard(ctx context.Context, now time.Time) (dashboardData, error) {
	op := s.d.Operator
	loc := op.Location()
	b, err := op.Budget(ctx)
	if err != nil {
		return dashboardData{}, err
	}
	d := dashboardData{
		Now:      now.In(loc).Format("2006-01-02 15:04:05"),
		Zone:     loc.String(),
		Budget:   b,
		Refusals: withShadow(s.refusalsToday.list(budget.DayKey(now, loc)), s.shadowToday.list(budget.DayKey(now, loc))),
		TopUsers: op.TopUsers(10, now),
	}
	to := budget.DayKey(now, loc)
	from := budget.DayKey(now.AddDate(0, 0, -29), loc)
	if d.Days, err = op.BudgetDays(from, to); err != nil {
		return dashboardData{}, err
	}
	d.Chart = chart(now, loc, d.Days)
	d.Findings = s.dashboardFindings(now)
	return d, nil
}

func (s *Server) handleDashboard(c echo.Context) error {
	d, err := s.dashboard(c.Request().Context(), s.now())
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderContentType, "text/html; charset=utf-8")
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	c.Response().WriteHeader(http.StatusOK)
	return dashboardPage.Execute(c.Response(), d)
}

// chart draws 30 days of calls (bars) and cost (a line) as inline SVG.
// Everything in it is a number or a date this code formats, so it is safe
// to embed unescaped.
func chart(now time.Time, loc *time.Location, days []budget.LedgerDay) template.HTML {
	const w, h, left, right, top, bottom = 900, 240, 50, 70, 10, 30
	byDay := map[string]budget.DayTotals{}
	for _, d := range days {
		byDay[d.Day] = d.DayTotals
	}
	var maxReq, maxSpend int64 = 1, 1
	for _, d := range days {
		maxReq, maxSpend = max(maxReq, d.Requests), max(maxSpend, d.SpendMicroUSD)
	}
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	slot := plotW / 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="calls and cost over the last 30 days">`, w, h, w, h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#b8bfcc"/>`, left, h-bottom, w-right, h-bottom)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%d</text>`, left-6, top+10, maxReq)
	fmt.Fprintf(&b, `<text x="%d" y="%d">$%.4f</text>`, w-right+6, top+10, float64(maxSpend)/1e6)
	var line []string
	for i := range 30 {
		day := budget.DayKey(now.AddDate(0, 0, i-29), loc)
		d := byDay[day]
		x := float64(left) + float64(i)*slot
		bh := plotH * float64(d.Requests) / float64(maxReq)
		fmt.Fprintf(&b, `<rect class="bar" data-day="%s" data-requests="%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#7aa2e3"><title>%s: %d calls, $%.4f</title></rect>`,
			day, d.Requests, x+2, float64(h-bottom)-bh, slot-4, bh, day, d.Requests, float64(d.SpendMicroUSD)/1e6)
		y := float64(h-bottom) - plotH*float64(d.SpendMicroUSD)/float64(maxSpend)
		line = append(line, fmt.Sprintf("%.1f,%.1f", x+slot/2, y))
		if i%5 == 4 || i == 29 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x+slot/2, h-bottom+16, day[5:])
		}
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#d9534f" stroke-width="2" points="%s"/>`, strings.Join(line, " "))
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}
