package postgres

import (
	"encoding/json"
	"fmt"

	"breakwater/detect"
)

var _ detect.AlertStore = (*DB)(nil)

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
