package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"breakwater/budget"
	"breakwater/server/guard/state"
	"breakwater/server/invites"
	"breakwater/storage"
	"breakwater/storage/postgres"
)

// migrateChunk is how many usage rows one import transaction carries.
const migrateChunk = 1000

// Copied says what a migration copied of each kind, and how many of each
// the bolt database held: a second run copies 0 of each.
type Copied struct {
	Kind         string
	Copied, Held int
}

// MigrateSource is the bolt database a migration copies.
type MigrateSource struct {
	Path string
	// Merge adds the source's money (ledger days, quota counts) to figures
	// the database already holds for the same days and users; without it
	// such an overlap is refused before anything is copied.
	Merge bool
}

// MigrateFromBolt copies the bolt database at from.Path into the
// PostgreSQL database of cfg (storage.backend = "postgres", its URL from
// BREAKWATER_POSTGRES_URL): users, API keys (their hashes: every key keeps
// working), invites with their redemptions and the mark of their secret,
// usage rows, plan quotas, the budget's ledger and the brake. Records
// already there are left as they are; the money's figures are added, each
// source's once (the bolt file's identity is recorded with them), so a
// second run copies nothing twice. Where the database already holds figures
// of the source's days or users from elsewhere (an instance served them),
// it refuses unless from.Merge, naming them. The server must be stopped: a
// bolt database a server holds is refused. progress receives a line per
// kind as it is copied.
func MigrateFromBolt(ctx context.Context, cfg Config, from MigrateSource, opts Options, progress io.Writer) ([]Copied, error) {
	opts = opts.withDefaults()
	if cfg.Storage.Backend != storage.BackendPostgres {
		return nil, errors.New("migrate copies a bolt database into PostgreSQL: set [storage] backend = \"postgres\" in the config first")
	}
	src, source, err := openSource(from.Path, opts)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	octx, cancel := context.WithTimeout(ctx, postgresOpenTimeout)
	dst, err := postgres.Open(octx, opts.Getenv(postgres.EnvURL), postgres.Options{Logger: opts.Logger, Now: opts.Now, MaxConns: int32(cfg.Storage.PostgresMaxConnections)})
	cancel()
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	loc, _ := cfg.Budget.Location() // checked by Load
	m := &migration{ctx: ctx, src: src, dst: dst, source: source, cal: budget.NewCalendar(loc), progress: progress, now: opts.Now()}
	if err := m.overlap(from.Merge); err != nil {
		return nil, err
	}
	for _, step := range []func() error{m.users, m.keys, m.invites, m.usage, m.ledger, m.quotas, m.brake} {
		if err := step(); err != nil {
			return m.done, err
		}
	}
	if err := m.checkSecret(opts.Getenv("BREAKWATER_SECRET")); err != nil {
		return m.done, err
	}
	return m.done, nil
}

// migration is one run of MigrateFromBolt.
type migration struct {
	ctx      context.Context
	src      *storage.DB
	dst      *postgres.DB
	source   string // the bolt file's identity (storage.DB.ID)
	cal      *budget.Calendar
	progress io.Writer
	done     []Copied

	now time.Time

	settled map[string]int64 // each day's settled cost, from its usage rows
	months  []string         // from the ledger's first month to now's
	mark    []byte           // the bolt invites' secret mark
}

// openSource opens the bolt database at path read only, with its
// identity: a file that has none yet (no Breakwater with identities opened
// it for writing) is opened for writing once, which gives it one.
func openSource(path string, opts Options) (*storage.DB, string, error) {
	open := func(readOnly bool) (*storage.DB, error) {
		db, err := storage.Open(path, storage.Options{ReadOnly: readOnly, MustExist: true, Timeout: operatorLockTimeout, Logger: opts.Logger})
		switch {
		case errors.Is(err, storage.ErrLocked):
			return nil, fmt.Errorf("a server holds %s: stop it first (the copy must see the database at rest)", path)
		case errors.Is(err, storage.ErrNoDatabase):
			return nil, fmt.Errorf("no database at %s", path)
		}
		return db, err
	}
	db, err := open(true)
	if err != nil {
		return nil, "", err
	}
	id, err := db.ID()
	if err == nil && id == "" {
		db.Close()
		w, err := open(false)
		if err != nil {
			return nil, "", fmt.Errorf("%s needs an identity, which it gets when opened for writing: %w", path, err)
		}
		if err := w.Close(); err != nil {
			return nil, "", err
		}
		if db, err = open(true); err != nil {
			return nil, "", err
		}
		if id, err = db.ID(); err == nil && id == "" {
			err = fmt.Errorf("%s has no identity after it was opened for writing", path)
		}
	}
	if err != nil {
		db.Close()
		return nil, "", err
	}
	return db, id, nil
}

// overlap refuses, unless merge, a database that holds figures of the
// source's days or users that the source did not bring: adding to them is
// right only when the operator means it (an instance served those days
// beside the old server, or before it stopped), and skipping them would
// drop the old server's spend.
func (m *migration) overlap(merge bool) error {
	days, err := m.src.BudgetDays("0000-01-01", "9999-12-31")
	if err != nil {
		return err
	}
	m.months = monthsSince(days, m.cal, m.now)
	quotas := map[string]map[string]int64{}
	for _, month := range m.months {
		if quotas[month], err = m.src.QuotaUsed(month); err != nil {
			return err
		}
	}
	o, err := m.dst.ImportOverlap(m.ctx, m.source, days, quotas)
	if err != nil || o.Empty() {
		return err
	}
	var what []string
	if len(o.Days) > 0 {
		what = append(what, fmt.Sprintf("the ledger of %s", listSome(o.Days)))
	}
	for _, mu := range o.Users {
		what = append(what, fmt.Sprintf("%s's quota counts of %s", mu.Month, listSome(mu.Users)))
	}
	if merge {
		fmt.Fprintf(m.progress, "merging: this database already counts %s; the bolt database's figures are added to them\n", strings.Join(what, ", "))
		return nil
	}
	return fmt.Errorf("this database already counts %s, which the bolt database counts too: "+
		"copying would either drop the bolt server's figures or add them to an instance's; "+
		"run migrate --merge to add them (each figure once, a rerun adds nothing), "+
		"or migrate into an empty database", strings.Join(what, ", "))
}

// listSome names up to five of list and how many more there are.
func listSome(list []string) string {
	if len(list) <= 5 {
		return strings.Join(list, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(list[:5], ", "), len(list)-5)
}

func (m *migration) note(kind string, copied, held int) {
	m.done = append(m.done, Copied{Kind: kind, Copied: copied, Held: held})
	fmt.Fprintf(m.progress, "%-12s %d copied of %d\n", kind, copied, held)
}

func (m *migration) users() error {
	users, err := m.src.Users()
	if err != nil {
		return err
	}
	n, err := m.dst.ImportUsers(m.ctx, users)
	m.note("users", n, len(users))
	return err
}

func (m *migration) keys() error {
	list, err := m.src.Keys()
	if err != nil {
		return err
	}
	n, err := m.dst.ImportKeys(m.ctx, list)
	m.note("keys", n, len(list))
	return err
}

func (m *migration) invites() error {
	list, err := m.src.Invites()
	if err != nil {
		return err
	}
	copied := 0
	for _, inv := range list {
		reds, err := m.src.Redemptions(inv.Hash)
		if err != nil && !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		redeemed := make([]postgres.Redemption, len(reds))
		for i, r := range reds {
			redeemed[i] = postgres.Redemption{Email: r.Email, At: r.At}
		}
		ok, err := m.dst.ImportInvite(inv, redeemed)
		if err != nil {
			return err
		}
		if ok {
			copied++
		}
	}
	if m.mark, err = m.src.InviteKeyMark(); err != nil {
		return err
	}
	if m.mark != nil {
		if _, err := m.dst.ImportInviteKeyMark(m.ctx, m.mark); err != nil {
			return err
		}
	}
	m.note("invites", copied, len(list))
	return nil
}

// usage copies the usage rows a month at a time, so that a large
// database is never in memory whole.
func (m *migration) usage() error {
	m.settled = map[string]int64{}
	copied, held := 0, 0
	for _, month := range m.months {
		start, _ := time.ParseInLocation("2006-01", month, m.cal.Location())
		rows, err := m.src.Usage(start, start.AddDate(0, 1, 0))
		if err != nil {
			return err
		}
		held += len(rows)
		for _, r := range rows {
			m.settled[m.cal.Day(r.Time)] += r.CostMicroUSD
		}
		for len(rows) > 0 {
			chunk := rows[:min(migrateChunk, len(rows))]
			rows = rows[len(chunk):]
			n, err := m.dst.ImportUsage(m.ctx, chunk, m.cal)
			if err != nil {
				return err
			}
			copied += n
		}
	}
	m.note("usage rows", copied, held)
	return nil
}

// monthsSince lists every month from the ledger's first day's to now's: a
// paid read is always in the ledger, so no usage row is older.
func monthsSince(days []budget.LedgerDay, cal *budget.Calendar, now time.Time) []string {
	last := cal.Month(now)
	first := last
	if len(days) > 0 && days[0].Day[:len("2006-01")] < first {
		first = days[0].Day[:len("2006-01")]
	}
	if len(days) > 0 && days[len(days)-1].Day[:len("2006-01")] > last {
		last = days[len(days)-1].Day[:len("2006-01")] // a clock behind the ledger
	}
	var months []string
	t, _ := time.Parse("2006-01", first)
	for month := first; month <= last; month = t.Format("2006-01") {
		months = append(months, month)
		t = t.AddDate(0, 1, 0)
	}
	return months
}

func (m *migration) ledger() error {
	days, err := m.src.BudgetDays("0000-01-01", "9999-12-31")
	if err != nil {
		return err
	}
	n, err := m.dst.ImportLedger(m.ctx, m.source, days, m.settled)
	m.note("ledger days", n, len(days))
	return err
}

// quotas adds each month's quota counts; only the current month's
// count, but a past month's is kept for the operator's figures.
func (m *migration) quotas() error {
	copied, held := 0, 0
	for _, month := range m.months {
		used, err := m.src.QuotaUsed(month)
		if err != nil {
			return err
		}
		n, err := m.dst.ImportQuotas(m.ctx, m.source, month, used)
		if err != nil {
			return err
		}
		copied, held = copied+n, held+len(used)
	}
	m.note("quotas", copied, held)
	return nil
}

func (m *migration) brake() error {
	on, err := m.src.Flag(state.BrakeFlag)
	if err != nil || !on {
		return err
	}
	n, err := m.dst.ImportFlag(m.ctx, state.BrakeFlag, on)
	m.note("brake", n, 1)
	return err
}

// checkSecret says whether the instances, run with secret, will verify the
// invites copied: they were keyed with the bolt server's secret.
func (m *migration) checkSecret(secret string) error {
	if m.mark == nil {
		return nil // unkeyed invites: the first instance keys them with its secret
	}
	if secret == "" {
		return errNoSharedSecret
	}
	key, err := invites.NewKey([]byte(secret))
	if err != nil {
		return err
	}
	if string(key.Mark()) != string(m.mark) {
		fmt.Fprintf(m.progress, "warning: the invites were keyed with another secret than BREAKWATER_SECRET: run every instance "+
			"with the bolt server's secret (BREAKWATER_SECRET then, or the contents of %s beside its database), or remake the invites\n", SecretFile)
	}
	return nil
}
