package storage

import (
	"encoding/json"
	"fmt"
	"time"

	"go.etcd.io/bbolt"

	"breakwater/detect"
	"breakwater/server/invites"
)

var _ detect.PersonalPruner = (*DB)(nil)

// PrunePersonal deletes the personal data that outlives the raw
// statistics events, once it is past retention: days before beforeDay
// ("2006-01-02") lose their findings and the per-IP and per-e-mail figures
// of their aggregates (the per-user figures and the service's stay, for
// the detectors and the dashboard), and an invite that can no longer be
// redeemed at now (revoked, expired or used up) loses the e-mails that
// redeemed it before before. An invite that can still be redeemed keeps
// its e-mails: they are what stops one e-mail from taking two uses, and
// `invites delete` removes them. It returns how many records it changed
// or deleted, in one transaction.
func (db *DB) PrunePersonal(beforeDay string, before, now time.Time) (int, error) {
	if err := checkDay(beforeDay); err != nil {
		return 0, fmt.Errorf("prune personal data: %w", err)
	}
	n := 0
	err := db.update(func(tx *bbolt.Tx) error {
		n = 0
		cut := []byte(beforeDay)
		agg := tx.Bucket(bucketAggregates)
		var days [][]byte
		c := agg.Cursor()
		for k, _ := c.First(); k != nil && string(k) < string(cut); k, _ = c.Next() {
			days = append(days, append([]byte(nil), k...))
		}
		for _, day := range days {
			var st detect.DayStats
			if _, err := getJSON(agg, day, &st); err != nil {
				return err
			}
			if st.IPs == nil && st.Emails == nil {
				continue
			}
			st.IPs, st.Emails = nil, nil
			if err := putJSON(agg, day, st); err != nil {
				return err
			}
			n++
		}
		fb := tx.Bucket(bucketFindings)
		var old [][]byte
		fc := fb.Cursor()
		for k, _ := fc.First(); k != nil && string(k) < string(cut); k, _ = fc.Next() {
			old = append(old, append([]byte(nil), k...))
		}
		for _, day := range old {
			if err := fb.DeleteBucket(day); err != nil {
				return fmt.Errorf("findings %s: %w", day, err)
			}
			n++
		}
		return tx.Bucket(bucketInvites).ForEach(func(k, v []byte) error {
			var inv invites.Invite
			if err := json.Unmarshal(v, &inv); err != nil {
				return fmt.Errorf("invite %x: %w", k, err)
			}
			if inv.Check(false, now) == invites.InviteRedeemed {
				return nil // still redeemable: its e-mails are needed
			}
			rb, err := redemptionsOf(tx, k)
			if err != nil {
				return err
			}
			var gone [][]byte
			err = rb.ForEach(func(email, rv []byte) error {
				var r redemptionValue
				if err := json.Unmarshal(rv, &r); err != nil {
					return fmt.Errorf("invite %s: redemption: %w", inv.ID, err)
				}
				if r.At.Before(before) {
					gone = append(gone, append([]byte(nil), email...))
				}
				return nil
			})
			if err != nil {
				return err
			}
			for _, email := range gone {
				if err := rb.Delete(email); err != nil {
					return err
				}
				n++
			}
			return nil
		})
	})
	if err != nil {
		return 0, fmt.Errorf("prune personal data: %w", err)
	}
	return n, nil
}
