package selftest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"breakwater/budget"
	"breakwater/ocr"
	"breakwater/server/app"
)

// pricing is what a read of a sample image costs on the service under
// test, by the model that read it: ocr.model, or ocr.fallback_model past
// a soft ceiling of [budget]. Each model's price is ocr.Config.PriceOf,
// what the server reserves and settles a call to it at, and a read costs
// the usage the simulated upstream reports for that model.
type pricing struct {
	ocr               ocr.Config
	primary, fallback string // fallback is "" when none is set
	day               string // the service's ledger day, whose prices count
}

func pricingOf(c ocr.Config, day string) pricing {
	c = c.WithDefaults()
	return pricing{ocr: c, primary: c.Model, fallback: c.FallbackModel, day: day}
}

// cost is a sample read's cost on model, and the worst case a call to it
// is reserved at; ok is false for a model that is neither of the config's.
func (p pricing) cost(model string) (cost, worst int64, ok bool) {
	if model == "" || (model != p.primary && model != p.fallback) {
		return 0, 0, false
	}
	price, ok := p.ocr.PriceOf(model)
	if !ok {
		return 0, 0, false
	}
	price = price.On(p.day)
	w, h := sampleSize()
	return max(price.Cost(ocr.SimulatedUsage(price, w, h)), 1), price.WorstCase(w, h), true
}

// worth is how many sample reads ceiling pays for, one after another from
// a fresh month: on the primary model until a soft line is reached, then
// on the fallback.
func (p pricing) worth(ceiling int64, soft softLines) int64 {
	pc, _, _ := p.cost(p.primary)
	reads := ceiling / pc
	if p.fallback == "" {
		return reads
	}
	first := soft.reads(pc)
	if first >= reads {
		return reads
	}
	fc, _, _ := p.cost(p.fallback)
	return first + (ceiling-first*pc)/fc
}

// cheapest is the lowest cost of a sample read on either model.
func (p pricing) cheapest() int64 {
	c, _, _ := p.cost(p.primary)
	if fc, _, ok := p.cost(p.fallback); ok {
		c = min(c, fc)
	}
	return c
}

// bill is what got cost, each read at the price of the model its answer
// names, and the words that say so; unpriced names the reads on a model
// the config does not price.
func (p pricing) bill(got reads) (spent int64, words, unpriced string) {
	models := []string{p.primary}
	if p.fallback != "" {
		models = append(models, p.fallback)
	}
	for _, m := range slices.Sorted(func(yield func(string) bool) {
		for m := range got {
			if !slices.Contains(models, m) && !yield(m) {
				return
			}
		}
	}) {
		unpriced += fmt.Sprintf("; %s answered by %q, which the config does not price", readsOf(got[m]), m)
	}
	var parts []string
	for _, m := range models {
		c, _, _ := p.cost(m)
		spent += got[m] * c
		part := fmt.Sprintf("%s at %s", readsOf(got[m]), dollars(c))
		if p.fallback != "" {
			part = fmt.Sprintf("%s on %s at %s", readsOf(got[m]), m, dollars(c))
		}
		parts = append(parts, part)
	}
	return spent, strings.Join(parts, ", "), unpriced
}

// softLines are the soft ceilings of [budget] in integer units, 0 for off:
// past one, a read goes to the fallback model.
type softLines struct{ requests, daily, monthly int64 }

func softOf(b budget.Config) softLines {
	return softLines{b.SoftDailyRequests, budget.MicroUSD(b.SoftDailyUSD), budget.MicroUSD(b.SoftMonthlyUSD)}
}

// reads is how many reads of cost each, from a fresh month, reach a soft
// line (math.MaxInt64 when none is on).
func (s softLines) reads(cost int64) int64 {
	n := int64(math.MaxInt64)
	if s.requests > 0 {
		n = s.requests
	}
	for _, usd := range []int64{s.daily, s.monthly} {
		if usd > 0 {
			n = min(n, (usd+cost-1)/cost)
		}
	}
	return n
}

// reached says whether a fresh month with calls calls that spent spent
// is past a soft line: where the next read goes to the fallback.
func (s softLines) reached(calls, spent int64) bool {
	return (s.requests > 0 && calls >= s.requests) || (s.daily > 0 && spent >= s.daily) || (s.monthly > 0 && spent >= s.monthly)
}

// scaled is s with each line times f, as the ceiling of key is scaled to
// ceiling: a line below that ceiling stays below it.
func (s softLines) scaled(f float64, key string, ceiling int64) softLines {
	daily, monthly := int64(math.MaxInt64), int64(math.MaxInt64)
	if key == "budget.daily_usd" {
		daily = ceiling
	} else {
		monthly = ceiling
	}
	return softLines{scaleLine(s.requests, f, math.MaxInt64), scaleLine(s.daily, f, daily), scaleLine(s.monthly, f, monthly)}
}

// note names the lines that are on, for a scaled-down check's line.
func (s softLines) note() string {
	var parts []string
	if s.requests > 0 {
		parts = append(parts, "soft_daily_requests at "+thousands(s.requests))
	}
	if s.daily > 0 {
		parts = append(parts, "soft_daily_usd at "+dollars(s.daily))
	}
	if s.monthly > 0 {
		parts = append(parts, "soft_monthly_usd at "+dollars(s.monthly))
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ")
}

// set puts the lines in c.
func (s softLines) set(c *budget.Config) {
	c.SoftDailyRequests, c.SoftDailyUSD, c.SoftMonthlyUSD = s.requests, usdOf(s.daily), usdOf(s.monthly)
}

// scaleLine is a line scaled by f: rounded down, at least 1, and below
// limit. A line that is off (0) stays off.
func scaleLine(line int64, f float64, limit int64) int64 {
	if line <= 0 {
		return 0
	}
	return max(1, min(int64(float64(line)*f), limit-1))
}

// money checks a ceiling in dollars, key ("budget.daily_usd" or
// "budget.monthly_usd"), at usd on a service where only it can refuse:
// four times the reads it pays for in parallel, then one at a time. Each
// read costs what pricing says of the model its answer names, so the
// spend is the sum of the 200s at their models' costs. It holds if the
// spend never passed the ceiling, came within the next call's worst case
// of it (the brake admits a call only while its worst case fits; past a
// soft line the next call goes to the fallback), and the next read was
// refused by the brake. A ceiling worth more than the scale's reads is
// tested at that many reads' worth, the soft lines scaled alike.
func (r *runner) money(key string, usd float64) (Result, error) {
	p := pricingOf(r.cfg.OCR, r.cfg.Today(serviceStart(r.cfg)))
	ceiling, soft := budget.MicroUSD(usd), softOf(r.cfg.Budget)
	worth, note := p.worth(ceiling, soft), ""
	if worth > r.scale {
		f := float64(r.scale) / float64(worth)
		ceiling = int64(float64(ceiling) * f)
		soft = soft.scaled(f, key, ceiling)
		worth = p.worth(ceiling, soft)
		note = fmt.Sprintf(" (tested scaled down, at %s: %s reads' worth%s)", dollars(ceiling), thousands(worth), soft.note())
	}
	sent, got, tail, err := r.brake(worth, ceiling/p.cheapest(), func(c *app.Config) {
		soft.set(&c.Budget)
		if key == "budget.daily_usd" {
			c.Budget.DailyUSD = usdOf(ceiling)
		} else {
			c.Budget.MonthlyUSD = usdOf(ceiling)
		}
	})
	if err != nil {
		return Result{}, err
	}
	spent, bill, unpriced := p.bill(got)
	next := p.primary
	if p.fallback != "" && soft.reached(got.total(), spent) {
		next = p.fallback
	}
	_, worst, _ := p.cost(next)
	worstWords := "a call's worst case " + dollars(worst)
	if p.fallback != "" {
		worstWords = fmt.Sprintf("the next read's worst case %s, on %s", dollars(worst), next)
	}
	line := fmt.Sprintf("%s = %s%s: %s parallel requests, %s, %s spent (%s), then %s%s",
		key, strconv.FormatFloat(usd, 'f', -1, 64), note, thousands(sent), bill, dollars(spent), worstWords, tail, unpriced)
	held := unpriced == "" && spent <= ceiling && spent+worst > ceiling && tail.held
	return Result{Limit: key, Line: line, Held: held}, nil
}

// usdOf is micro as a dollar figure of config.toml: the one whose
// budget.MicroUSD is micro (micro/1e6 may be a hair below it).
func usdOf(micro int64) float64 {
	usd := float64(micro) / 1e6
	for budget.MicroUSD(usd) < micro {
		usd = math.Nextafter(usd, math.Inf(1))
	}
	return usd
}

// readsOf is n reads in words: "1 read", "2,000 reads".
func readsOf(n int64) string {
	if n == 1 {
		return "1 read"
	}
	return thousands(n) + " reads"
}

// dollars is micro-dollars as dollars, to the micro-dollar.
func dollars(micro int64) string {
	return "$" + strconv.FormatFloat(float64(micro)/1e6, 'f', -1, 64)
}
