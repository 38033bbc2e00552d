package main

// The postgres cases' refusals (issue 29): a one-key flood over its rate
// (429) and random unknown keys (401), on one instance on bolt and on two
// instances sharing one PostgreSQL database, with the database's
// transactions per 1,000 refusals; and the idle rate of every case
// database, the instances' background work with no request, measured once
// a round over an idle interval as long as a case, so that the
// transactions of a case can be shown with and without it.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxTxPerThousandRefusals is issue 29's bound on PostgreSQL transactions
// per 1,000 refusals of a cached key; the random keys' flood is held to
// it too (the issue's own test asks none of them at all).
const maxTxPerThousandRefusals = 1.0

// minRefusalRatio is issue 29's bound on the refusals answered a second
// on two postgres instances over one bolt instance.
const minRefusalRatio = 0.9

// rejectingConfig is the refusal cases' config: one request an hour, so
// that every request of the flood after the first is over the rate.
func rejectingConfig(pprof bool) bwConfig {
	return bwConfig{rate: 1, window: "1h", burst: 1, inFlightPerUser: 1024, maxConnections: 8192, ceilings: true, pprof: pprof}
}

// refusalCases are one backend's refusal cases: its one key over its rate
// (primed on every instance first) and random unknown keys.
func (b *bench) refusalCases(insts []*breakwater, db *pgDatabase, img []byte, key string) ([]tcase, error) {
	backend, id := "bolt, 1 instance", "bolt"
	if db != nil {
		backend, id = "postgres, "+strconv.Itoa(len(insts))+" instances", "pg"+strconv.Itoa(len(insts))
	}
	first := insts[0]
	for _, bw := range insts {
		if err := primeOverRate(bw, key, img); err != nil {
			return nil, err
		}
	}
	base := b.baseCase(insts, db)
	base.refusals = true
	over, unknown := base, base
	over.id, over.label, over.expect = id+"-429", "rejected, 1 key over its rate (429), "+backend, http.StatusTooManyRequests
	over.request = oneOf(ocrRequest(first.addr, key, img))
	unknown.id, unknown.label, unknown.expect = id+"-401", "rejected, random keys (401), "+backend, http.StatusUnauthorized
	unknown.request = randomKeys(first.addr, img)
	return []tcase{over, unknown}, nil
}

// primeOverRate sends key's reads to bw until one is refused with a 429:
// the first is accepted (one an hour), unless another instance sharing
// the limit took it.
func primeOverRate(bw *breakwater, key string, img []byte) error {
	req := oneOf(ocrRequest(bw.addr, key, img))
	var seen []string
	for range 3 {
		out := generate(load{addr: bw.addr, clients: 1, total: 1, request: req})
		if out.statuses[http.StatusTooManyRequests] == 1 {
			return nil
		}
		seen = append(seen, statusSummary(sample{statuses: out.statuses, errors: out.errors}))
	}
	return fmt.Errorf("%s: the rejecting key got %s, never a 429", bw.name, strings.Join(seen, "; "))
}

// refusals is the instance's count of refusals
// (breakwater_refusals_total, every layer and reason).
func (b *breakwater) refusals() (float64, error) {
	return b.sumSeries("breakwater_refusals_total", "")
}

// idleSample is a database's transactions over an idle interval.
type idleSample struct {
	tx   float64
	span time.Duration
}

// caseSpan is how long a case on PostgreSQL is counted: its warm-up, its
// measured time and the wait for the statistics.
func (p plan) caseSpan() time.Duration { return p.warmup + p.duration + pgStatsSettle }

// databases are the distinct databases of the cases, in order.
func (b *bench) databases() []*pgDatabase {
	var out []*pgDatabase
	for _, c := range b.cases {
		if c.pg != nil && !containsDB(out, c.pg) {
			out = append(out, c.pg)
		}
	}
	return out
}

func containsDB(dbs []*pgDatabase, d *pgDatabase) bool {
	for _, x := range dbs {
		if x == d {
			return true
		}
	}
	return false
}

// measureIdle counts every case database's transactions over one idle
// interval as long as a case (no request sent), all at once.
func (b *bench) measureIdle() map[string]idleSample {
	dbs := b.databases()
	out := make([]idleSample, len(dbs))
	errs := make([]error, len(dbs))
	var wg sync.WaitGroup
	for i, d := range dbs {
		wg.Go(func() {
			t0 := time.Now()
			before, err := d.transactions()
			time.Sleep(b.plan.caseSpan())
			after, err2 := d.transactions()
			out[i], errs[i] = idleSample{tx: after - before, span: time.Since(t0)}, errors.Join(err, err2)
		})
	}
	wg.Wait()
	m := map[string]idleSample{}
	for i, d := range dbs {
		if errs[i] != nil {
			b.idleErr = errors.Join(b.idleErr, fmt.Errorf("idle interval, %s: %w", d.label, errs[i]))
			continue
		}
		m[d.name] = out[i]
		b.progress("idle %s: %.0f transactions in %s", d.label, out[i].tx, out[i].span.Round(time.Millisecond))
	}
	return m
}

// idleRate is a database's median over the rounds of its idle
// transactions a second; ok is false when no round measured it.
func (r *report) idleRate(d *pgDatabase) (float64, bool) {
	var vs []float64
	for _, round := range r.idle {
		if s, ok := round[d.name]; ok && s.span > 0 {
			vs = append(vs, s.tx/s.span.Seconds())
		}
	}
	return median(vs), len(vs) > 0
}

// txPer is a postgres case's medians over the rounds of its database's
// transactions per counted answer (accepted reads, or refusals), with
// the idle rate's share over the case's span and without it; ok is false
// when no round counted any answer.
func (r *report) txPer(c tcase) (with, idle, without float64, ok bool) {
	rate, _ := r.idleRate(c.pg)
	var ws, is, wos []float64
	for _, s := range r.samples[c.id] {
		if s.served > 0 && s.pgErr == nil {
			bg := rate * s.span.Seconds()
			tx := s.pgCommits + s.pgRollbacks
			ws, is, wos = append(ws, tx/s.served), append(is, bg/s.served), append(wos, (tx-bg)/s.served)
		}
	}
	return median(ws), median(is), median(wos), len(ws) > 0
}
