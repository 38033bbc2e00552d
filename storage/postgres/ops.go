package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"breakwater/budget"
)

// records is an instance's own part of the records: its name in the
// claims of idempotency keys.
type records struct {
	ownerOnce sync.Once
	owner     string
}

// ownerID is this instance's name in answer claims, made at first use.
func (r *records) ownerID() string {
	r.ownerOnce.Do(func() { r.owner = newOwnerID() })
	return r.owner
}

// The operator's reads of the money records, which the usage recorder and
// the ledger write (usage_rows, ledger_days: the odd-numbered
// migrations), and the backup of every table.

// Usage returns the usage rows with from <= Time < to, in time order
// (equal times in the order written). A row's body, when it holds the
// record's JSON (budget.UsageRecord's field names are its stored
// encoding), is the record; otherwise the record is read from the row's
// columns.
func (db *DB) Usage(from, to time.Time) ([]budget.UsageRecord, error) {
	if to.IsZero() {
		to = farFuture
	}
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT at, user_id, key_id, request_id, micro_usd, input_tokens, output_tokens, model, body
		FROM usage_rows WHERE at >= $1 AND at < $2 ORDER BY at, id`, from, to)
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (budget.UsageRecord, error) {
		var rec budget.UsageRecord
		var in, out int64
		var keyID, requestID, model *string
		var body []byte
		if err := r.Scan(&rec.Time, &rec.UserID, &keyID, &requestID, &rec.CostMicroUSD, &in, &out, &model, &body); err != nil {
			return rec, err
		}
		if len(body) > 0 && body[0] == '{' {
			var full budget.UsageRecord
			if err := json.Unmarshal(body, &full); err != nil {
				return rec, fmt.Errorf("usage row of %s at %s: %w", rec.UserID, rec.Time, err)
			}
			return full, nil
		}
		rec.Time = rec.Time.UTC()
		rec.KeyID, rec.RequestID, rec.Model = deref(keyID), deref(requestID), deref(model)
		rec.PromptTokens, rec.CandidatesTokens = int(in), int(out)
		return rec, nil
	})
	if err != nil {
		return nil, fmt.Errorf("usage: %w", err)
	}
	return recs, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// BudgetDays returns the ledger's days from..to inclusive, in day order:
// the service's figures, whichever instance asks: the calls settled (made)
// and their cost, not the totals that also hold the instances' lease
// rests.
func (db *DB) BudgetDays(from, to string) ([]budget.LedgerDay, error) {
	if err := checkDay(from); err != nil {
		return nil, fmt.Errorf("budget days: %w", err)
	}
	if err := checkDay(to); err != nil {
		return nil, fmt.Errorf("budget days: %w", err)
	}
	ctx, cancel := opContext()
	defer cancel()
	rows, err := db.pool.Query(ctx, `SELECT day, settled_calls, settled_micro_usd FROM ledger_days WHERE day >= $1 AND day <= $2 ORDER BY day`, from, to)
	if err != nil {
		return nil, fmt.Errorf("budget days: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (budget.LedgerDay, error) {
		var d budget.LedgerDay
		err := r.Scan(&d.Day, &d.Requests, &d.SpendMicroUSD)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("budget days: %w", err)
	}
	return out, nil
}

// Path is what the operator sees as the database's location: the
// database's URL without its password (postgres://user@host:port/db).
func (db *DB) Path() string {
	c := db.pool.Config().ConnConfig
	return (&url.URL{Scheme: "postgres", User: url.User(c.User), Host: net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), Path: "/" + c.Database}).String()
}

// Backup writes a logical dump of the database to w, from one read-only
// snapshot (REPEATABLE READ) while writers go on, and returns the bytes
// written. The dump is a psql script that restores into a new, empty
// database by itself: it makes the schema as breakwater's first start
// does (the migrations up to the database's version, each recorded in
// breakwater_schema), then for each table but breakwater_schema a
// COPY ... FROM stdin with its rows, then sets each sequence past its
// table's highest id. Run as the role the instances use, in one
// transaction (psql -X -v ON_ERROR_STOP=1 --single-transaction -f FILE
// "$URL"), it makes the tables theirs; a database that already holds
// Breakwater's tables refuses it whole.
func (db *DB) Backup(w io.Writer) (int64, error) {
	cw := &countingWriter{w: w}
	ctx := context.Background()
	err := pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		tables, err := backupTables(ctx, tx)
		if err != nil {
			return err
		}
		if err := db.writeSchema(cw); err != nil {
			return err
		}
		for _, t := range tables {
			cols := pgx.Identifier{t.name}.Sanitize() + " (" + t.columns + ")"
			fmt.Fprintf(cw, "COPY %s FROM stdin;\n", cols)
			if _, err := tx.Conn().PgConn().CopyTo(ctx, cw, "COPY "+cols+" TO STDOUT"); err != nil {
				return fmt.Errorf("table %s: %w", t.name, err)
			}
			fmt.Fprintf(cw, "\\.\n\n")
		}
		for _, t := range tables {
			if t.serial != "" {
				fmt.Fprintf(cw, "SELECT setval(pg_get_serial_sequence('%s', '%s'), coalesce((SELECT max(%s) FROM %s), 0) + 1, false);\n",
					t.name, t.serial, pgx.Identifier{t.serial}.Sanitize(), pgx.Identifier{t.name}.Sanitize())
			}
		}
		return cw.err
	})
	if err != nil {
		return cw.n, fmt.Errorf("backup: %w", err)
	}
	return cw.n, nil
}

// writeSchema writes the head of a backup's script: how to restore it, a
// refusal of a database that holds Breakwater's tables already, and the
// schema at the database's version, made as migrate makes it.
func (db *DB) writeSchema(w io.Writer) error {
	list, err := migrationList()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "-- Breakwater backup of a PostgreSQL database, schema %d, taken %s.\n", db.schema, db.now().UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "-- Restore it into a new, empty database, as the role the instances use:\n")
	fmt.Fprintf(w, "--   psql -X -v ON_ERROR_STOP=1 --single-transaction -f THIS_FILE \"$%s\"\n", EnvURL)
	fmt.Fprintf(w, "-- It makes the schema, then fills it; a database that holds Breakwater's tables refuses it whole.\n")
	fmt.Fprintf(w, "SET client_encoding = 'UTF8';\n")
	fmt.Fprintf(w, "DO $$ BEGIN IF to_regclass('breakwater_schema') IS NOT NULL THEN\n"+
		"RAISE EXCEPTION 'this database holds Breakwater''s tables already: restore into a new, empty database'; END IF; END $$;\n\n")
	fmt.Fprintf(w, "CREATE TABLE %s;\n\n", schemaTable)
	for _, m := range list {
		if m.version > db.schema {
			break
		}
		fmt.Fprintf(w, "-- migration %s\n%s\n;\nINSERT INTO breakwater_schema (version, name) VALUES (%d, '%s');\n\n",
			m.name, strings.TrimSpace(m.sql), m.version, m.name)
	}
	return nil
}

// backupTable is a table of the dump: its name, its columns in order
// (quoted, joined) and its serial column, if it has one.
type backupTable struct {
	name, columns, serial string
}

// backupTables lists the tables of the current schema, by name, with
// their columns.
func backupTables(ctx context.Context, tx pgx.Tx) ([]backupTable, error) {
	rows, err := tx.Query(ctx, `SELECT c.table_name,
		string_agg(quote_ident(c.column_name), ', ' ORDER BY c.ordinal_position),
		coalesce(max(c.column_name) FILTER (WHERE c.column_default LIKE 'nextval(%'), '')
		FROM information_schema.columns c JOIN information_schema.tables t
		ON t.table_schema = c.table_schema AND t.table_name = c.table_name
		WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE' AND c.table_name <> 'breakwater_schema'
		GROUP BY c.table_name ORDER BY c.table_name COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (backupTable, error) {
		var t backupTable
		err := r.Scan(&t.name, &t.columns, &t.serial)
		return t, err
	})
}

// countingWriter counts what it writes and keeps the first error.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}
