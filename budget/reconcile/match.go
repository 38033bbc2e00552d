package reconcile

import (
	"slices"
	"strings"
)

// Matcher names the model of a billing row from its description, and
// tells the Gemini API's rows from other services'.
type Matcher struct {
	services map[string]bool
	names    []pattern // longest first
	skus     []pattern // in the config's order
}

// pattern is a name in normal form (see normal) and the model it means.
type pattern struct {
	text  string
	model string
}

// NewMatcher matches the model names (the table's families and the
// overrides' names; a "models/" prefix is dropped), then the SKU rules,
// on rows of services.
func NewMatcher(models []string, skus []SKU, services []string) *Matcher {
	m := &Matcher{services: map[string]bool{}}
	for _, s := range services {
		m.services[strings.ToLower(strings.TrimSpace(s))] = true
	}
	for _, name := range models {
		name = strings.TrimPrefix(name, "models/")
		if n := normal(name); n != "" {
			m.names = append(m.names, pattern{text: n, model: name})
		}
	}
	// The longest name first: "gemini 3.5 flash lite" is tried before
	// "gemini 3.5 flash", which it contains.
	slices.SortStableFunc(m.names, func(a, b pattern) int { return len(b.text) - len(a.text) })
	for _, s := range skus {
		m.skus = append(m.skus, pattern{text: normal(s.Match), model: s.Model})
	}
	return m
}

// Gemini reports whether service (a row's service name) is the Gemini API.
func (m *Matcher) Gemini(service string) bool {
	return m.services[strings.ToLower(strings.TrimSpace(service))]
}

// Model names the model of description: the longest model name it
// contains as whole words, case and spaces or hyphens aside ("Gemini 3.5
// Flash Lite Input Tokens" is gemini-3.5-flash-lite, never
// gemini-3.5-flash), else the first SKU rule whose match it contains.
// ok is false when neither names one.
func (m *Matcher) Model(description string) (model string, ok bool) {
	d := " " + normal(description) + " "
	for _, p := range m.names {
		if strings.Contains(d, " "+p.text+" ") {
			return p.model, true
		}
	}
	for _, p := range m.skus {
		if p.text != "" && strings.Contains(d, p.text) {
			return p.model, true
		}
	}
	return "", false
}

// Canonical is the name a usage row's model is reported under: the
// model name it is a version of ("gemini-2.5-flash-001" is
// gemini-2.5-flash), else itself without "models/".
func (m *Matcher) Canonical(model string) string {
	model = strings.TrimPrefix(model, "models/")
	d := " " + normal(model) + " "
	for _, p := range m.names {
		if strings.HasPrefix(d, " "+p.text+" ") {
			return p.model
		}
	}
	return model
}

// normal is s in lower case with hyphens, underscores and runs of space
// made one space, trimmed.
func normal(s string) string {
	s = strings.ToLower(s)
	s = strings.NewReplacer("-", " ", "_", " ", "\t", " ").Replace(s)
	return strings.Join(strings.Fields(s), " ")
}
