// Package operator provides the operator's commands as one Service with
// two implementations: Operator carries them out on the keyring, the
// invites, the layers' live state and storage (the admin API calls it while
// the server runs, the CLI while it is stopped), and AdminClient sends
// them to a running server's admin API. It holds no policy of its own.
package operator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"breakwater/budget"
	"breakwater/budget/reconcile"
	"breakwater/detect"
	"breakwater/limiter"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/server/keys"
)

// Service is the operator's commands, whichever way they reach the
// service.
type Service interface {
	CreateKey(ctx context.Context, user, plan string) (string, KeyInfo, error)
	ListKeys(ctx context.Context) ([]KeyInfo, error)
	RevokeKey(ctx context.Context, id string) (KeyInfo, error)
	SetBanned(ctx context.Context, user string, banned, create bool) (UserInfo, error)
	SetPlan(ctx context.Context, user, plan string) (UserInfo, error)
	Usage(ctx context.Context, user string) ([]UsageInfo, error)
	Budget(ctx context.Context) (BudgetInfo, error)
	SetBrake(ctx context.Context, on bool) (BudgetInfo, error)
	Backup(ctx context.Context, w io.Writer, target string) error
	CreateInvite(ctx context.Context, uses int, ttl time.Duration, note string) (string, InviteInfo, error)
	ListInvites(ctx context.Context) ([]InviteInfo, error)
	RevokeInvite(ctx context.Context, id string) (InviteInfo, error)
	DeleteInvite(ctx context.Context, id string) (InviteInfo, error)
	DetectRun(ctx context.Context, day string, mail bool) (detect.Report, error)
	Cooldowns(ctx context.Context) ([]CooldownInfo, error)
	ClearCooldown(ctx context.Context, source, key string) (CooldownInfo, error)
	EachRecorded(ctx context.Context, from, to time.Time, fn func(detect.Event) error) ([]detect.Finding, error)
	Ledger(ctx context.Context, from, to string) (reconcile.Ledger, error)
}

var (
	_ Service = (*Operator)(nil)
	_ Service = (*AdminClient)(nil)
)

// The records of the service: a key and a user as the keyring describes
// them, an invite as the invites do.
type (
	// KeyInfo describes an API key without its secret.
	KeyInfo = keys.KeyInfo
	// UserInfo describes a user.
	UserInfo = keys.UserInfo
	// InviteInfo describes an invite without its code.
	InviteInfo = invites.Info
)

// Store is what the operator's commands need from storage.
type Store interface {
	SetFlag(name string, on bool) error
	Usage(from, to time.Time) ([]budget.UsageRecord, error)
	Backup(w io.Writer) (int64, error)
	BudgetDays(from, to string) ([]budget.LedgerDay, error)
	LoadState(name string) (map[string][]byte, error)
	RecordStore
	Path() string
}

// ErrBackupOntoDatabase refuses a backup whose target is the live database
// file itself: writing the copy there would replace the file under the
// running server, which would go on writing to the deleted one.
var ErrBackupOntoDatabase = errors.New("server: the backup target is the live database")

// Operator carries out the operator's commands: the admin API calls it
// while the server runs, and the CLI calls it directly on the database
// while the server is stopped, so both paths do exactly the same.
type Operator struct {
	keys    *keys.Keyring
	invites *invites.Codes
	layers  Layers
	store   Store
	plans   func() map[string]budget.Plan
	loc     *time.Location
	now     func() time.Time

	pending   PendingEvents    // nil until SetPendingEvents: the stored events alone
	detection Detection        // nil until SetDetection
	cooldowns []CooldownSource // empty until SetCooldowns: none to list
	brakeMu   sync.Mutex
	onChange  func() // Options.Changed
}

// Layers are what the operator reads and switches of the layers' live
// state: budget.Attempts, budget.Quotas and budget.Global implement them.
type Layers struct {
	Attempts interface {
		Count(user string, now time.Time) int64
		Top(n int, now time.Time) []budget.UserCount
	}
	Quotas interface {
		Used(user string, now time.Time) int64
	}
	Brake interface {
		Status(now time.Time) budget.Status
		SetManual(on bool)
	}
}

// Options are the operator's optional dependencies.
type Options struct {
	// Now is the clock of usage days and budget figures. Nil: time.Now.
	Now func() time.Time
	// Changed is called after each change that may lift a refusal (a
	// user banned, unbanned or moved to another plan, a key created or
	// revoked, the brake switched, a cooldown cleared): the server clears
	// its deny cache (guard.Deny). Nil: none.
	Changed func()
}

// New returns the operator over the keyring, the invites, the layers'
// live state and storage. plans returns the plans in force (they may be
// reloaded).
func New(kr *keys.Keyring, codes *invites.Codes, layers Layers, store Store, plans func() map[string]budget.Plan, loc *time.Location, o Options) *Operator {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Operator{keys: kr, invites: codes, layers: layers, store: store, plans: plans, loc: loc, now: o.Now, onChange: o.Changed}
}

// changed reports a change that may lift a refusal when err is nil, and
// returns err.
func (o *Operator) changed(err error) error {
	if err == nil && o.onChange != nil {
		o.onChange()
	}
	return err
}

// PendingEvents gives the statistics rows counted in memory and not
// stored yet: detect.Recorder's refusals by a layer of the minute under
// way.
type PendingEvents interface {
	PendingRefusals() []detect.Event
}

// SetPendingEvents has Usage add p's rows to the stored ones, so that a
// running server's figures of today are live rather than up to a minute
// behind.
func (o *Operator) SetPendingEvents(p PendingEvents) { o.pending = p }

// Location is the time zone of days and months (budget.timezone).
func (o *Operator) Location() *time.Location { return o.loc }

// TopUsers describes the n users with the most attempts today, most
// first, for the dashboard.
func (o *Operator) TopUsers(n int, now time.Time) []UsageInfo {
	plans := o.plans()
	users := o.keys.Users()
	var out []UsageInfo
	for _, u := range o.layers.Attempts.Top(n, now) {
		info := UsageInfo{User: u.User, AttemptsToday: u.Count, ReadsMonth: o.layers.Quotas.Used(u.User, now)}
		for _, known := range users {
			if known.ID == u.User {
				info.Plan, info.Banned = known.Plan, known.Banned
			}
		}
		p := plans[info.Plan]
		info.DailyLine, info.MonthlyQuota = p.DailyAttempts, p.MonthlyQuota
		out = append(out, info)
	}
	return out
}

// BudgetDays lists the ledger's days from from to to (YYYY-MM-DD). The
// brake's current day is shown as the brake counts it: the ledger's
// total for it also holds the unused rest of the brake's lease, headroom
// written ahead of calls not yet made.
func (o *Operator) BudgetDays(from, to string) ([]budget.LedgerDay, error) {
	days, err := o.store.BudgetDays(from, to)
	if err != nil || o.layers.Brake == nil {
		return days, err
	}
	st := o.layers.Brake.Status(o.now())
	for i := range days {
		if days[i].Day == st.Day {
			days[i].DayTotals = budget.DayTotals{Requests: st.Requests, SpendMicroUSD: st.SpendMicroUSD}
		}
	}
	return days, nil
}

// CreateKey makes a new API key; see keys.Keyring.Create.
func (o *Operator) CreateKey(_ context.Context, user, plan string) (string, KeyInfo, error) {
	secret, info, err := o.keys.Create(user, plan)
	return secret, info, o.changed(err)
}

// ListKeys lists every key without secrets.
func (o *Operator) ListKeys(context.Context) ([]KeyInfo, error) { return o.keys.List() }

// RevokeKey disables a key on the next request. An id that is not text
// is ErrBadID.
func (o *Operator) RevokeKey(_ context.Context, id string) (KeyInfo, error) {
	if err := CheckID(KindKey, id); err != nil {
		return KeyInfo{}, err
	}
	info, err := o.keys.Revoke(id)
	return info, o.changed(err)
}

// CreateInvite makes a new invite code; see Invites.Create.
func (o *Operator) CreateInvite(_ context.Context, uses int, ttl time.Duration, note string) (string, InviteInfo, error) {
	return o.invites.Create(uses, ttl, note)
}

// ListInvites lists every invite without its code.
func (o *Operator) ListInvites(context.Context) ([]InviteInfo, error) { return o.invites.List() }

// RevokeInvite refuses the code from the next verification on. An id
// that is not text is ErrBadID.
func (o *Operator) RevokeInvite(_ context.Context, id string) (InviteInfo, error) {
	if err := CheckID(KindInvite, id); err != nil {
		return InviteInfo{}, err
	}
	return o.invites.Revoke(id)
}

// DeleteInvite removes an invite and the e-mails that redeemed it. An id
// that is not text is ErrBadID.
func (o *Operator) DeleteInvite(_ context.Context, id string) (InviteInfo, error) {
	if err := CheckID(KindInvite, id); err != nil {
		return InviteInfo{}, err
	}
	return o.invites.Delete(id)
}

// SetBanned bans or unbans a user; the next request sees it. An id with
// no record is ErrNotFound unless create (see keys.Keyring.SetBanned).
func (o *Operator) SetBanned(_ context.Context, user string, banned, create bool) (UserInfo, error) {
	info, err := o.keys.SetBanned(user, banned, create)
	return info, o.changed(err)
}

// SetPlan moves a user to another plan.
func (o *Operator) SetPlan(_ context.Context, user, plan string) (UserInfo, error) {
	info, err := o.keys.SetPlan(user, plan)
	return info, o.changed(err)
}

// UsageInfo is one user's figures for today and this month.
type UsageInfo struct {
	User          string  `json:"user"`
	Plan          string  `json:"plan"`
	Banned        bool    `json:"banned"`
	AttemptsToday int64   `json:"attempts_today"`
	DailyLine     int64   `json:"daily_line"` // 0: none
	ReadsToday    int64   `json:"reads_today"`
	ReadsMonth    int64   `json:"reads_month"`
	MonthlyQuota  int64   `json:"monthly_quota"`
	CostTodayUSD  float64 `json:"cost_today_usd"`
	CostMonthUSD  float64 `json:"cost_month_usd"`
	// ReadsTodayByModel counts today's reads per model that read them
	// (ocr.model, or ocr.fallback_model in degraded mode).
	ReadsTodayByModel map[string]int64 `json:"reads_today_by_model,omitempty"`
	// ShadowToday counts, per layer, the requests of today that a layer
	// in shadow mode would have refused (they went on): the stored rows,
	// and while the server runs the minute it still counts in memory.
	ShadowToday map[string]int64 `json:"shadow_today,omitempty"`
}

// Usage reports today's attempts and this month's reads, quota and cost,
// for one user or (user "") for every user.
func (o *Operator) Usage(_ context.Context, user string) ([]UsageInfo, error) {
	now := o.now()
	l := now.In(o.loc)
	monthStart := time.Date(l.Year(), l.Month(), 1, 0, 0, 0, 0, o.loc)
	rows, err := o.store.Usage(monthStart, monthStart.AddDate(0, 1, 0))
	if err != nil {
		return nil, err
	}
	today := budget.DayKey(now, o.loc)
	cost, readsToday, costToday := map[string]int64{}, map[string]int64{}, map[string]int64{}
	byModel := map[string]map[string]int64{}
	for _, r := range rows {
		cost[r.UserID] += r.CostMicroUSD
		if budget.DayKey(r.Time, o.loc) == today {
			readsToday[r.UserID]++
			costToday[r.UserID] += r.CostMicroUSD
			if byModel[r.UserID] == nil {
				byModel[r.UserID] = map[string]int64{}
			}
			byModel[r.UserID][r.Model]++
		}
	}
	shadow, _, err := o.shadowToday(now)
	if err != nil {
		return nil, err
	}
	users := o.keys.Users()
	if user != "" {
		id, err := o.keys.Resolve(user)
		if err != nil {
			return nil, err
		}
		users = slices.DeleteFunc(users, func(u UserInfo) bool { return u.ID != id })
	}
	plans := o.plans()
	out := make([]UsageInfo, 0, len(users))
	for _, u := range users {
		p := plans[u.Plan]
		out = append(out, UsageInfo{
			User: u.ID, Plan: u.Plan, Banned: u.Banned,
			AttemptsToday: o.layers.Attempts.Count(u.ID, now), DailyLine: p.DailyAttempts,
			ReadsToday: readsToday[u.ID], ReadsMonth: o.layers.Quotas.Used(u.ID, now), MonthlyQuota: p.MonthlyQuota,
			CostTodayUSD: usd(costToday[u.ID]), CostMonthUSD: usd(cost[u.ID]), ShadowToday: shadow[u.ID],
			ReadsTodayByModel: byModel[u.ID],
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].User < out[j].User })
	return out, nil
}

// ShadowToday counts, per layer, the requests of today that a layer in
// shadow mode would have refused, on every route (the invite check's and
// the guarded routes' included): what Usage counts per user, from the same
// source, for the dashboard. It is read from the stored statistics events,
// which a restart and a restore keep and which on PostgreSQL are every
// instance's, and while the server runs the minute it still counts in
// memory.
func (o *Operator) ShadowToday(now time.Time) (map[string]int64, error) {
	_, byLayer, err := o.shadowToday(now)
	return byLayer, err
}

// shadowToday reads today's would-be refusals of layers in shadow mode,
// per user (the users' own: not the invite check's e-mails, nor requests
// without a user) and per layer (every one).
func (o *Operator) shadowToday(now time.Time) (byUser map[string]map[string]int64, byLayer map[string]int64, err error) {
	dayStart, dayEnd, err := detect.DayBounds(budget.DayKey(now, o.loc), o.loc)
	if err != nil {
		return nil, nil, err
	}
	byUser, byLayer = map[string]map[string]int64{}, map[string]int64{}
	count := func(e detect.Event) error {
		if e.Outcome != detect.OutcomeShadowRefused || e.Time.Before(dayStart) || !e.Time.Before(dayEnd) {
			return nil
		}
		byLayer[e.Layer] += e.N()
		if e.Route != detect.RouteInvite && e.UserID != "" {
			if byUser[e.UserID] == nil {
				byUser[e.UserID] = map[string]int64{}
			}
			byUser[e.UserID][e.Layer] += e.N()
		}
		return nil
	}
	// The stored rows first, then the minute still counted in memory: a
	// minute stored in between is missed for a moment, never counted twice.
	if err := o.store.EachEvent(dayStart, dayEnd, count); err != nil {
		return nil, nil, err
	}
	if o.pending != nil {
		for _, e := range o.pending.PendingRefusals() {
			count(e)
		}
	}
	return byUser, byLayer, nil
}

// BudgetInfo is the global budget against its ceilings (0 = off).
type BudgetInfo struct {
	Day           string  `json:"day"`
	Requests      int64   `json:"requests_today"`
	DailyRequests int64   `json:"daily_requests"`
	SpendUSD      float64 `json:"spend_today_usd"`
	DailyUSD      float64 `json:"daily_usd"`
	Month         string  `json:"month"`
	MonthSpendUSD float64 `json:"spend_month_usd"`
	MonthlyUSD    float64 `json:"monthly_usd"`
	Manual        bool    `json:"manual_brake"`
	Engaged       bool    `json:"brake_engaged"`
	EngagedBy     string  `json:"engaged_by,omitempty"`
	// DegradedBy names the soft ceiling reached ("" for none): reads of
	// plans on model = "auto" go to ocr.fallback_model.
	DegradedBy string `json:"degraded_by,omitempty"`
	// ReadsByModel counts today's reads per model that read them, from
	// the usage rows.
	ReadsByModel map[string]int64 `json:"reads_today_by_model,omitempty"`
}

// Budget reports today's and this month's spend against each ceiling,
// whether reads are degraded to the fallback model, and today's reads per
// model.
func (o *Operator) Budget(context.Context) (BudgetInfo, error) {
	now := o.now()
	st := o.layers.Brake.Status(now)
	start, end, err := detect.DayBounds(st.Day, o.loc)
	if err != nil {
		return BudgetInfo{}, err
	}
	rows, err := o.store.Usage(start, end)
	if err != nil {
		return BudgetInfo{}, err
	}
	var byModel map[string]int64
	for _, r := range rows {
		if byModel == nil {
			byModel = map[string]int64{}
		}
		byModel[r.Model]++
	}
	return BudgetInfo{
		Day: st.Day, Requests: st.Requests, DailyRequests: st.DailyRequests,
		SpendUSD: usd(st.SpendMicroUSD), DailyUSD: usd(st.DailyMicroUSD),
		Month: st.Month, MonthSpendUSD: usd(st.MonthMicroUSD), MonthlyUSD: usd(st.MonthlyMicroUSD),
		Manual: st.Manual, Engaged: st.Engaged, EngagedBy: st.EngagedBy,
		DegradedBy: st.Degraded, ReadsByModel: byModel,
	}, nil
}

// SetBrake engages or releases the manual kill switch: stored first, so
// it survives a restart, then applied at once.
func (o *Operator) SetBrake(ctx context.Context, on bool) (BudgetInfo, error) {
	o.brakeMu.Lock() // two switches at once must leave disk and memory agreeing
	defer o.brakeMu.Unlock()
	if err := o.store.SetFlag(state.BrakeFlag, on); err != nil {
		return BudgetInfo{}, err
	}
	o.layers.Brake.SetManual(on)
	_ = o.changed(nil)
	return o.Budget(ctx)
}

// Backup writes a consistent copy of the database to w while the service
// goes on. The copy is taken into a local temporary file first and only
// then sent: the read transaction behind it would otherwise stay open for
// as long as a slow client takes to download, and while it is open the
// database file cannot grow, so every paid request would wait.
//
// target is where the caller will put the copy ("" if it does not say): a
// target that is the database file itself, under any name, is refused
// with ErrBackupOntoDatabase before anything is written.
func (o *Operator) Backup(_ context.Context, w io.Writer, target string) error {
	if err := o.CheckBackupTarget(target); err != nil {
		return err
	}
	tmp, err := os.CreateTemp("", "breakwater-backup-*.db")
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	if _, err := o.store.Backup(tmp); err != nil {
		return err
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	_, err = io.Copy(w, tmp)
	return err
}

// Database is the path of the database file the service holds.
func (o *Operator) Database() string { return o.store.Path() }

// IsDatabase reports whether path names the database file the service
// holds, under any name (see sameFile). The CLI's config and the server
// are on one machine (the CLI reaches the admin API only when the file's
// lock is held there), so this is exact: two instances never share one
// file, the lock sees to that.
func (o *Operator) IsDatabase(path string) bool { return sameFile(path, o.store.Path()) }

// CheckBackupTarget refuses a backup target that is the database file.
func (o *Operator) CheckBackupTarget(target string) error {
	if target != "" && sameFile(target, o.store.Path()) {
		return fmt.Errorf("backup: %s is the live database; write the copy elsewhere: %w", target, ErrBackupOntoDatabase)
	}
	return nil
}

// sameFile reports whether paths a and b name one file: the same clean
// absolute path, or (for files that exist) the same inode, which also
// catches hard and symbolic links.
func sameFile(a, b string) bool {
	absA, errA := filepath.Abs(a)
	absB, errB := filepath.Abs(b)
	if errA == nil && errB == nil && absA == absB {
		return true
	}
	infoA, errA := os.Stat(a)
	infoB, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(infoA, infoB)
}

// Cooldowns are the fail limits whose cooldowns the operator lists and
// lifts: limiter.FailLimiter implements it.
type Cooldowns interface {
	Cooling(now time.Time) []limiter.Cooldown
	Clear(key string) bool
}

// SourceInvites is the source of the invite limits' cooldowns; a guarded
// route's is RouteSource(name).
const SourceInvites = "invites"

// RouteSource names the source of the [[routes]] entry name's cooldowns.
func RouteSource(name string) string { return "route:" + name }

// CooldownSource is one fail limit and the name it is listed under:
// SourceInvites or RouteSource(name).
type CooldownSource struct {
	Name  string
	Fails Cooldowns
}

// SetCooldowns gives the operator the fail limits whose cooldowns it
// lists and lifts, in the order it lists them; it replaces any given
// before.
func (o *Operator) SetCooldowns(sources ...CooldownSource) {
	o.cooldowns = slices.Clone(sources)
}

// CooldownInfo is a key in a cooldown ("ip:203.0.113.7",
// "email:ann@example.com"), the fail limit that holds it ("invites",
// "route:referral") and when it ends.
type CooldownInfo struct {
	Source      string    `json:"source"`
	Key         string    `json:"key"`
	Until       time.Time `json:"until"`
	LeftSeconds int64     `json:"left_seconds"`
}

// ErrNoCooldown refuses to clear a key that is in no cooldown, or a
// source that is no fail limit.
var ErrNoCooldown = errors.New("operator: no cooldown on that key")

// Cooldowns lists the keys in a cooldown, source by source, with the
// time left.
func (o *Operator) Cooldowns(context.Context) ([]CooldownInfo, error) {
	out := []CooldownInfo{}
	now := o.now()
	for _, src := range o.cooldowns {
		for _, c := range src.Fails.Cooling(now) {
			out = append(out, CooldownInfo{Source: src.Name, Key: c.Key, Until: c.Until,
				LeftSeconds: int64(c.Until.Sub(now).Round(time.Second) / time.Second)})
		}
	}
	return out, nil
}

// ClearCooldown lifts the cooldown of key in source ("" is
// SourceInvites) at once and forgets its run of failures; a key in no
// cooldown there is ErrNoCooldown; a key or a source that is not text,
// ErrBadID.
func (o *Operator) ClearCooldown(_ context.Context, source, key string) (CooldownInfo, error) {
	if source == "" {
		source = SourceInvites
	}
	if err := CheckID(KindCooldownSource, source); err != nil {
		return CooldownInfo{}, err
	}
	if err := CheckID(KindCooldownKey, key); err != nil {
		return CooldownInfo{}, err
	}
	now := o.now()
	for _, src := range o.cooldowns {
		if src.Name != source {
			continue
		}
		for _, c := range src.Fails.Cooling(now) {
			if c.Key == key && src.Fails.Clear(key) {
				_ = o.changed(nil)
				return CooldownInfo{Source: src.Name, Key: c.Key, Until: c.Until,
					LeftSeconds: int64(c.Until.Sub(now).Round(time.Second) / time.Second)}, nil
			}
		}
	}
	return CooldownInfo{}, fmt.Errorf("%s %q: %w", source, key, ErrNoCooldown)
}

// usd turns micro-dollars into dollars for display.
func usd(micro int64) float64 { return float64(micro) / 1e6 }

// FormatUSD writes an amount in dollars of BudgetInfo or UsageInfo (a
// spend, a ceiling) for people: every digit down to the micro-dollar the
// ledger counts in, trailing zeros left out, at least two decimals
// ("$0.007", "$0.00687", "$12.50", "$2.505"). It never rounds: a ceiling
// of daily_usd = 0.007 reads "$0.007", not "$0.01" beside a spend of
// "$0.00687".
func FormatUSD(v float64) string {
	micro := int64(math.Round(v * 1e6)) // v is a count of micro-dollars / 1e6
	sign := ""
	if micro < 0 {
		sign, micro = "-", -micro
	}
	s := strings.TrimRight(fmt.Sprintf("%d.%06d", micro/1e6, micro%1e6), "0")
	if decimals := len(s) - strings.IndexByte(s, '.') - 1; decimals < 2 {
		s += strings.Repeat("0", 2-decimals)
	}
	return sign + "$" + s
}
