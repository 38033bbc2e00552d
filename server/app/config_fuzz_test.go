package app

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/knadh/koanf/parsers/toml/v2"
)

// FuzzLoad feeds the config loader a config.toml and one environment
// variable. Nothing may panic, and a config it accepts must:
//   - hold only keys that name a field of Config, checked against the raw
//     TOML tree (tables, arrays of tables and all), so a typo never
//     switches a limit off;
//   - take its environment variable, if it looks like an override, as
//     the override of a known key;
//   - decode to no negative number, no NaN and no infinity anywhere: every
//     limit, ceiling, size, count and duration is 0 (off) or more;
//   - load again to the same values.
func FuzzLoad(f *testing.F) {
	shipped, err := os.ReadFile("../../config.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(shipped), "", "")
	f.Add(minimal, "BREAKWATER_LIMITS__USER__RATE", "-5")
	f.Add(minimal, "BREAKWATER_BUDGET__DAILY_USD", "nan")
	f.Add(minimal+"[limits.user]\nrate = -1\n", "", "")
	f.Add(minimal+"[limits.user]\nrte = 5\n", "", "")
	f.Add(minimal+"[budget]\ndaily_usd = inf\n", "", "")
	f.Add(minimal+"[alerts]\n", "", "")
	f.Add(minimal+"[[routes]]\nname = \"login\"\npath = \"/login\"\nidentity = \"ip\"\nrate = 5\nburst = 1\n", "", "")
	f.Add(minimal+"[[routes]]\nname = \"x\"\npath = \"/x\"\nidentity = \"ip\"\nmax_bdy = 5\n", "", "")
	f.Add(minimal+"[server]\nupload_grace = 5\n", "BREAKWATER_SERVER__UPLOAD_GRACE", "-1s")
	f.Add("[plans.free]\nmonthly_quota = 1e3\ndaily_attempts = 2.5\n", "BREAKWATER_X", "1")

	saved := environ
	f.Cleanup(func() { environ = saved })
	f.Fuzz(func(t *testing.T, body, envKey, envValue string) {
		environ = func() []string { return []string{envKey + "=" + envValue} }
		getenv := func(k string) string {
			if k == envKey {
				return envValue
			}
			return ""
		}
		path := filepath.Join(t.TempDir(), "config.toml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := Load(path, getenv)
		if err != nil {
			return
		}
		tree, err := toml.Parser().Unmarshal([]byte(body))
		if err != nil {
			t.Fatalf("accepted a config the TOML parser refuses: %v", err)
		}
		if key := unknownKey(reflect.TypeFor[Config](), "", tree); key != "" {
			t.Fatalf("accepted unknown key %q", key)
		}
		if envValue != "" && strings.HasPrefix(envKey, envPrefix) && strings.Contains(envKey, "__") && !secretVars[envKey] {
			if !knownEnv(envKey, c) {
				t.Fatalf("accepted %s, which names no key", envKey)
			}
		}
		if key := badNumber(reflect.ValueOf(c), ""); key != "" {
			t.Fatalf("accepted %s", key)
		}
		again, err := Load(path, getenv)
		if err != nil {
			t.Fatalf("loads once, not twice: %v", err)
		}
		if changed := ChangedKeys(c, again); len(changed) > 0 {
			t.Fatalf("loaded twice, %v differ", changed)
		}
	})
}

// unknownKey walks the raw TOML tree against t's koanf tags and returns
// the first key that names no field, "" if there is none.
func unknownKey(t reflect.Type, prefix string, tree map[string]any) string {
	for name, v := range tree {
		key := prefix + name
		f, ok := fieldByTag(t, name)
		if !ok {
			return key
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		sub, isTable := v.(map[string]any)
		switch {
		case ft == reflect.TypeFor[time.Duration]():
		case ft.Kind() == reflect.Struct && isTable:
			if k := unknownKey(ft, key+".", sub); k != "" {
				return k
			}
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct && isTable:
			for entry, ev := range sub {
				et, ok := ev.(map[string]any)
				if !ok {
					continue // not a table: the decoder's type check refuses it
				}
				if k := unknownKey(ft.Elem(), key+"."+entry+".", et); k != "" {
					return k
				}
			}
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			items, _ := v.([]any)
			for i, item := range items {
				if it, ok := item.(map[string]any); ok {
					if k := unknownKey(ft.Elem(), fmt.Sprintf("%s[%d].", key, i), it); k != "" {
						return k
					}
				}
			}
		}
	}
	return ""
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	if t.Kind() != reflect.Struct {
		return reflect.StructField{}, false
	}
	for i := range t.NumField() {
		if f := t.Field(i); f.Tag.Get("koanf") == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// knownEnv reports whether name is the override of a key of c: a field
// path, with the plan names c holds.
func knownEnv(name string, c Config) bool {
	for key := range flatten(c) {
		if envName(key) == name {
			return true
		}
	}
	return false
}

// badNumber returns the first number in v that is negative, NaN or
// infinite, with its key, "" if there is none.
func badNumber(v reflect.Value, key string) string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return ""
		}
		return badNumber(v.Elem(), key)
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			if k := badNumber(v.Field(i), key+"."+f.Tag.Get("koanf")); k != "" {
				return k
			}
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			if b := badNumber(v.MapIndex(k), key+"."+k.String()); b != "" {
				return b
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			if b := badNumber(v.Index(i), fmt.Sprintf("%s[%d]", key, i)); b != "" {
				return b
			}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v.Int() < 0 {
			return fmt.Sprintf("%s = %d", key, v.Int())
		}
	case reflect.Float32, reflect.Float64:
		if f := v.Float(); f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Sprintf("%s = %v", key, f)
		}
	}
	return ""
}
