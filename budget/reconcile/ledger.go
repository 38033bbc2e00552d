package reconcile

// Ledger is what Breakwater counted over a span of days: the ledger's
// day totals, and its usage rows summed per day and model. The
// difference between a day's total and its usage rows is the calls that
// left no usage row (a failed call settled at its cost, a withheld
// answer, a call left open at its worst case): Compare reports it as the
// day's unattributed line rather than guess a model.
type Ledger struct {
	Days   []LedgerDay `json:"days"`
	Models []Counted   `json:"models"`
}

// LedgerDay is one day's total in the ledger, as the budget counts it.
type LedgerDay struct {
	Day           string `json:"day"` // "2006-01-02" in budget.timezone
	Calls         int64  `json:"calls"`
	SpendMicroUSD int64  `json:"spend_micro_usd"`
}

// Counted is the usage rows of one day and model, summed.
type Counted struct {
	Day          string `json:"day"`
	Model        string `json:"model"` // as the rows name it
	Reads        int64  `json:"reads"`
	CostMicroUSD int64  `json:"cost_micro_usd"`
	InputTokens  int64  `json:"input_tokens"`
	OutputTokens int64  `json:"output_tokens"` // candidates and thoughts: both billed as output
}

// Summer sums usage rows into a Ledger's Models, one day and model at a
// time, so that a caller reading rows day by day holds only the sums.
type Summer struct {
	index map[[2]string]int
	out   []Counted
}

// Add counts one usage row.
func (s *Summer) Add(day, model string, costMicroUSD int64, input, candidates, thoughts int) {
	if s.index == nil {
		s.index = map[[2]string]int{}
	}
	key := [2]string{day, model}
	i, ok := s.index[key]
	if !ok {
		i = len(s.out)
		s.index[key] = i
		s.out = append(s.out, Counted{Day: day, Model: model})
	}
	c := &s.out[i]
	c.Reads++
	c.CostMicroUSD += costMicroUSD
	c.InputTokens += int64(input)
	c.OutputTokens += int64(candidates) + int64(thoughts)
}

// Counted is the sums so far, in the order first seen.
func (s *Summer) Counted() []Counted { return s.out }
