package keys

import (
	"sync/atomic"

	"breakwater/budget"
)

// Plans holds the plans in force. A config reload swaps them at once;
// requests in flight keep the plan they looked up.
type Plans struct {
	p atomic.Pointer[map[string]budget.Plan]
}

// NewPlans returns a holder with plans in force.
func NewPlans(plans map[string]budget.Plan) *Plans {
	var p Plans
	p.Set(plans)
	return &p
}

// Set replaces the plans in force with a copy of plans.
func (p *Plans) Set(plans map[string]budget.Plan) {
	m := make(map[string]budget.Plan, len(plans))
	for k, v := range plans {
		m[k] = v
	}
	p.p.Store(&m)
}

// Get returns the named plan.
func (p *Plans) Get(name string) (budget.Plan, bool) {
	plan, ok := (*p.p.Load())[name]
	return plan, ok
}

// Has reports whether the named plan exists.
func (p *Plans) Has(name string) bool {
	_, ok := p.Get(name)
	return ok
}

// All returns the plans in force; the map must not be changed.
func (p *Plans) All() map[string]budget.Plan { return *p.p.Load() }
