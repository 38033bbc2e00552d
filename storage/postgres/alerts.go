package postgres

import (
	"encoding/json"
	"fmt"
	"time"

	"breakwater/detect"
)

var (
	_ detect.AlertStore   = (*DB)(nil)
	_ detect.AlertClaimer = (*DB)(nil)
)

// SaveAlertState records that an alert of st.Kind was sent at st.SentAt.
// The state is shared: an alert one instance sent is not sent again by
// another within its interval, once that one has read the states.
func (db *DB) SaveAlertState(st detect.AlertState) error {
	if st.Kind == "" {
		return fmt.Errorf("save alert state: %w: no kind", ErrInvalid)
	}
	v, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("save alert state %s: %w", st.Kind, err)
	}
	ctx, cancel := opContext()
	defer cancel()
	if _, err := db.pool.Exec(ctx, `INSERT INTO alert_states (kind, state) VALUES ($1, $2)
		ON CONFLICT (kind) DO UPDATE SET state = excluded.state`, st.Kind, v); err != nil {
		return fmt.Errorf("save alert state %s: %w", st.Kind, err)
	}
	return nil
}

// ClaimAlert stores st as the last sending of st.Kind unless the stored
// one holds it back: a sending in the same period (st.Period) after
// notBefore. It is one conditional upsert on the kind's row, so of the
// instances that claim the same alert at once exactly one wins, and
// min_interval holds across instances. When st loses, the state that held
// it back is returned.
func (db *DB) ClaimAlert(st detect.AlertState, notBefore time.Time) (bool, detect.AlertState, error) {
	if st.Kind == "" {
		return false, detect.AlertState{}, fmt.Errorf("claim alert: %w: no kind", ErrInvalid)
	}
	v, err := json.Marshal(st)
	if err != nil {
		return false, detect.AlertState{}, fmt.Errorf("claim alert %s: %w", st.Kind, err)
	}
	ctx, cancel := opContext()
	defer cancel()
	// The stored state holds st back when it is a sending of the same
	// period (a re-armed kind has none) later than notBefore.
	var raw []byte
	var claimed bool
	err = db.pool.QueryRow(ctx, `WITH claim AS (
			INSERT INTO alert_states AS s (kind, state) VALUES ($1, $2)
			ON CONFLICT (kind) DO UPDATE SET state = excluded.state
			WHERE NOT (coalesce(s.state->>'period', '') = $3 AND $3 <> ''
				AND (s.state->>'sent_at')::timestamptz > $4)
			RETURNING true)
		SELECT EXISTS (SELECT 1 FROM claim), (SELECT state FROM alert_states WHERE kind = $1)`,
		st.Kind, v, st.Period, notBefore).Scan(&claimed, &raw)
	if err != nil {
		return false, detect.AlertState{}, fmt.Errorf("claim alert %s: %w", st.Kind, err)
	}
	if claimed {
		return true, st, nil
	}
	held := detect.AlertState{Kind: st.Kind}
	if raw == nil {
		// Another instance inserted the kind's first row meanwhile: this
		// statement's snapshot does not show it.
		return false, held, nil
	}
	if err := json.Unmarshal(raw, &held); err != nil {
		return false, detect.AlertState{}, fmt.Errorf("claim alert %s: stored state: %w", st.Kind, err)
	}
	return false, held, nil
}

// AlertStates returns the last sending of every alert kind, by kind.
func (db *DB) AlertStates() ([]detect.AlertState, error) {
	ctx, cancel := opContext()
	defer cancel()
	out, err := jsonRows[detect.AlertState](ctx, db, `SELECT state FROM alert_states ORDER BY kind COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("alert states: %w", err)
	}
	return out, nil
}
