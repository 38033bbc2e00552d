package admin

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"breakwater/budget"
	"breakwater/budget/reconcile"
	"breakwater/detect"
	"breakwater/server/edge"
	"breakwater/server/operator"
)

//go:embed web/dashboard.html
var webFS embed.FS

var dashboardPage = template.Must(template.New("dashboard.html").Funcs(template.FuncMap{
	"usd": operator.FormatUSD, // every digit: a ceiling is never rounded
	"drift": func(d *float64) string {
		if d == nil {
			return "-"
		}
		return fmt.Sprintf("%+.2f", *d)
	},
}).ParseFS(webFS, "web/dashboard.html"))

// Dashboard is everything the dashboard shows (Server.Dashboard).
type Dashboard struct {
	Now      string
	Zone     string
	Budget   operator.BudgetInfo
	Refusals []edge.RefusalCount
	// Shadow are today's would-be refusals of layers in shadow mode, by
	// layer: what breakwater usage counts per user, read from the stored
	// statistics events (operator.ShadowToday), so that a restart or a
	// restore keeps them and on PostgreSQL they are every instance's;
	// ShadowError says why they are missing.
	Shadow      []ShadowRow
	ShadowError string
	TopUsers    []operator.UsageInfo
	Findings    []string
	Days        []budget.LedgerDay
	Chart       template.HTML // inline SVG drawn here, from numbers only
	CSRF        string        // the brake form's token

	// Service is whether the service has other instances (postgres):
	// then ServiceRefusals are every instance's refusals today, by layer,
	// and ServiceError says why they are missing.
	Service         bool
	ServiceRefusals []ServiceRefusalRow
	ServiceError    string

	// Reconciled is the daily reconciliation's last result (Reconciliation
	// false: none ran), ReconcileError why it is missing.
	Reconciliation bool
	Reconciled     reconcile.Last
	ReconcileError string
}

// ShadowRow is one layer's row of the dashboard's would-be refusals in
// shadow mode.
type ShadowRow struct {
	Layer string
	Count int64
}

// shadowRows lists the counts per layer, in layer order.
func shadowRows(byLayer map[string]int64) []ShadowRow {
	out := make([]ShadowRow, 0, len(byLayer))
	for layer, n := range byLayer {
		out = append(out, ShadowRow{Layer: layer, Count: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out
}

// Dashboard gathers the dashboard's figures at now.
func (s *Server) Dashboard(ctx context.Context, now time.Time) (Dashboard, error) {
	op := s.d.Operator
	loc := op.Location()
	b, err := op.Budget(ctx)
	if err != nil {
		return Dashboard{}, err
	}
	d := Dashboard{
		Now:      now.In(loc).Format("2006-01-02 15:04:05"),
		Zone:     loc.String(),
		Budget:   b,
		Refusals: s.edge.RefusalsOf(budget.DayKey(now, loc)),
		TopUsers: op.TopUsers(10, now),
		CSRF:     s.csrf.token,
	}
	if shadow, err := op.ShadowToday(now); err != nil {
		s.log.Warn("the shadow mode's counts not read for the dashboard", "err", err)
		d.ShadowError = "not read just now; see the log"
	} else {
		d.Shadow = shadowRows(shadow)
	}
	to := budget.DayKey(now, loc)
	from := budget.DayKey(now.AddDate(0, 0, -29), loc)
	if d.Days, err = op.BudgetDays(from, to); err != nil {
		return Dashboard{}, err
	}
	d.Chart = chart(now, loc, d.Days)
	d.Findings = s.dashboardFindings(now)
	if last, ok, err := op.LastReconciliation(); err != nil {
		s.log.Warn("the last reconciliation not read for the dashboard", "err", err)
		d.Reconciliation, d.ReconcileError = true, "not read just now; see the log"
	} else {
		d.Reconciliation, d.Reconciled = ok, last
	}
	if s.serviceRefusals != nil {
		d.Service = true
		rows, err := s.serviceRefusals.today(now)
		if err != nil {
			d.ServiceError = "not read from the database just now; see the log"
		}
		d.ServiceRefusals = serviceRefusalRows(rows)
	}
	return d, nil
}

func (s *Server) handleDashboard(c echo.Context) error {
	d, err := s.Dashboard(c.Request().Context(), s.now())
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderContentType, "text/html; charset=utf-8")
	c.Response().Header().Set("Cache-Control", "no-store")
	c.Response().Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'")
	c.Response().Header().Set("X-Frame-Options", "DENY")
	c.Response().WriteHeader(http.StatusOK)
	return dashboardPage.Execute(c.Response(), d)
}

// chart draws 30 days of calls (bars, scale on the left) and cost (a line
// with a dot on each day that cost anything, scale on the right) as inline
// SVG, with a zero line, gridlines, axis titles and units; each day's bar
// has a tooltip with its figures. Everything in it is a number or a date
// this code formats, so it is safe to embed unescaped.
func chart(now time.Time, loc *time.Location, days []budget.LedgerDay) template.HTML {
	const w, h, left, right, top, bottom = 900, 270, 64, 84, 28, 46
	byDay := map[string]budget.DayTotals{}
	var maxReq, maxSpend int64
	for _, d := range days {
		byDay[d.Day] = d.DayTotals
		maxReq, maxSpend = max(maxReq, d.Requests), max(maxSpend, d.SpendMicroUSD)
	}
	reqTop := evenCeil(maxReq)     // calls at the top gridline; its half is whole
	spendTop := niceCeil(maxSpend) // micro-dollars at the top gridline
	plotW, plotH := float64(w-left-right), float64(h-top-bottom)
	base := float64(h - bottom)
	slot := plotW / 30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="calls and cost per day over the last 30 days">`, w, h, w, h)
	// Gridlines at half and full scale, each labelled on both axes.
	for _, f := range []float64{0.5, 1} {
		y := base - plotH*f
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e7ee" stroke-dasharray="4 3"/>`, left, y, w-right, y)
		fmt.Fprintf(&b, `<text class="axis-calls" x="%d" y="%.1f" text-anchor="end">%d</text>`, left-6, y+4, int64(f*float64(reqTop)))
		fmt.Fprintf(&b, `<text class="axis-usd" x="%d" y="%.1f">%s</text>`, w-right+6, y+4, operator.FormatUSD(f*float64(spendTop)/1e6))
	}
	for i := range 30 {
		day := budget.DayKey(now.AddDate(0, 0, i-29), loc)
		d := byDay[day]
		x := float64(left) + float64(i)*slot
		bh := plotH * float64(d.Requests) / float64(reqTop)
		fmt.Fprintf(&b, `<rect class="bar" data-day="%s" data-requests="%d" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#7aa2e3"><title>%s: %d calls, %s</title></rect>`,
			day, d.Requests, x+2, base-bh, slot-4, bh, day, d.Requests, operator.FormatUSD(float64(d.SpendMicroUSD)/1e6))
		if i%5 == 4 || i == 29 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`, x+slot/2, base+16, day[5:])
		}
	}
	var line []string
	var dots strings.Builder
	for i := range 30 {
		d := byDay[budget.DayKey(now.AddDate(0, 0, i-29), loc)]
		x := float64(left) + float64(i)*slot + slot/2
		y := base - plotH*float64(d.SpendMicroUSD)/float64(spendTop)
		line = append(line, fmt.Sprintf("%.1f,%.1f", x, y))
		if d.SpendMicroUSD > 0 {
			fmt.Fprintf(&dots, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="#d9534f"/>`, x, y)
		}
	}
	fmt.Fprintf(&b, `<polyline fill="none" stroke="#d9534f" stroke-width="2" points="%s"/>`, strings.Join(line, " "))
	// The zero line and its labels, over the bars' feet and the cost line of days without cost.
	fmt.Fprintf(&b, `<line id="zero-line" x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="#48506a"/>`, left, base, w-right, base)
	fmt.Fprintf(&b, `<text class="axis-calls" x="%d" y="%.0f" text-anchor="end">0</text>`, left-6, base+4)
	fmt.Fprintf(&b, `<text class="axis-usd" x="%d" y="%.0f">$0</text>`, w-right+6, base+4)
	b.WriteString(dots.String())
	// Axis titles with their units, and the day axis.
	fmt.Fprintf(&b, `<text class="title" x="%d" y="%d">calls per day</text>`, left-50, top-12)
	fmt.Fprintf(&b, `<text class="title" x="%d" y="%d" text-anchor="end">cost per day (US$)</text>`, w-8, top-12)
	fmt.Fprintf(&b, `<text class="title" x="%.0f" y="%d" text-anchor="middle">day (month-day, %s)</text>`, float64(left)+plotW/2, h-6, loc)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// evenCeil is the smallest of 2, 4, 10, 20, 40, 100, ... at or above n:
// a round top for an axis of whole numbers whose half is whole too.
func evenCeil(n int64) int64 {
	for scale := int64(1); ; scale *= 10 {
		for _, m := range []int64{2, 4, 10} {
			if m*scale >= n {
				return m * scale
			}
		}
	}
}

// niceCeil is the smallest of 1, 2, 5, 10, 20, 50, ... at or above n.
func niceCeil(n int64) int64 {
	for scale := int64(1); ; scale *= 10 {
		for _, m := range []int64{1, 2, 5} {
			if m*scale >= n {
				return m * scale
			}
		}
	}
}

// formToken is the dashboard's defense against cross-site requests: an
// HMAC of the admin token under a key drawn at start, embedded in the
// page's form and required on its POST. A page from another site cannot
// read it (no CORS on the admin listener), and it changes with every
// restart and every admin token.
type formToken struct{ token string }

func newFormToken(adminToken string) formToken {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails (Go 1.24)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(adminToken))
	return formToken{token: hex.EncodeToString(mac.Sum(nil))}
}

// valid reports whether got is the token, in constant time.
func (f formToken) valid(got string) bool {
	return f.token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(f.token)) == 1
}

// handleDashboardBrake is the dashboard's brake button: a form POST with
// on=true or on=false and the page's token; the admin token is checked
// before it, as on every admin route. It answers with a redirect to the
// dashboard, which then shows the new state.
func (s *Server) handleDashboardBrake(c echo.Context) error {
	// sameOriginWrites has refused another origin's post already.
	if !s.csrf.valid(c.FormValue("csrf")) {
		s.log.Warn("dashboard brake form refused: missing or wrong form token")
		return errFormToken
	}
	var on bool
	switch c.FormValue("on") {
	case "true":
		on = true
	case "false":
	default:
		return edge.BadRequest("Send the form field on=true or on=false.")
	}
	if _, err := s.d.Operator.SetBrake(c.Request().Context(), on); err != nil {
		return err
	}
	s.log.Warn("manual brake set by the operator from the dashboard", "on", on)
	return c.Redirect(http.StatusSeeOther, "/")
}

// dashboardFindings lists the last week's findings, newest day first, and
// the last alert of each kind, for the dashboard.
func (s *Server) dashboardFindings(now time.Time) []string {
	var out []string
	if s.d.Alerts != nil {
		for _, st := range s.d.Alerts.Recent() {
			out = append(out, fmt.Sprintf("alert %s at %s: %s", st.Kind, st.SentAt.In(s.d.Operator.Location()).Format("2006-01-02 15:04"), st.Summary))
		}
	}
	loc := s.d.Operator.Location()
	l := now.In(loc)
	from := time.Date(l.Year(), l.Month(), l.Day()-7, 12, 0, 0, 0, loc).Format("2006-01-02")
	findings, err := s.d.Operator.RecentFindings(from)
	if err != nil {
		s.log.Warn("findings not shown on the dashboard", "err", err)
		return out
	}
	for i := len(findings) - 1; i >= 0 && len(out) < 50; i-- {
		f := findings[i]
		out = append(out, fmt.Sprintf("%s %s %s: %s", f.Day, f.Detector, f.Subject, detect.FiguresText(f.Figures)))
	}
	return out
}
