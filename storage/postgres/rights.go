package postgres

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The rights a role needs to serve. Making or upgrading the schema needs
// CREATE in its schema (the database's owner has it); once the schema is
// current an instance does no DDL, and a role with only these serves:
//
//   - CONNECT on the database;
//   - USAGE on the schema that holds the tables;
//   - SELECT, INSERT, UPDATE and DELETE on every table the migrations
//     make, SELECT on breakwater_schema;
//   - USAGE on the sequences of those tables (the ids of events and usage
//     rows);
//   - EXECUTE on the functions the migrations make (PostgreSQL grants it
//     to PUBLIC unless revoked).
//
// Open refuses a role that lacks one of them, before it serves anything,
// and Probe (config check) refuses it alike: a RightsError names what is
// missing and the GRANT that gives it.

// RightsDoc is where the minimal grants are documented.
const RightsDoc = `docs/INSTANCES.md, "Roles, TLS and connections"`

// RightsError says what the connected role lacks and what to grant.
type RightsError struct {
	Role, Database string
	// Lacks are the rights missing, "UPDATE on table money_owners".
	Lacks []string
	// Grants are the statements that give them, to run as the owner of
	// the tables or a superuser.
	Grants []string
	// Note is more advice, or "".
	Note string
}

func (e *RightsError) Error() string {
	lacks := e.Lacks
	more := ""
	if len(lacks) > 4 {
		more = fmt.Sprintf(" (and %d more)", len(lacks)-4)
		lacks = lacks[:4]
	}
	msg := fmt.Sprintf("postgres: the role %s lacks rights serve needs in database %s: %s%s; as the tables' owner or a superuser, run: %s",
		e.Role, e.Database, strings.Join(lacks, ", "), more, strings.Join(e.Grants, "; "))
	if e.Note != "" {
		msg += "; " + e.Note
	}
	return msg + " (" + RightsDoc + ")"
}

var (
	createdTable = regexp.MustCompile(`(?i)\bCREATE\s+(?:UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?([a-z_][a-z0-9_]*)`)
	createdFunc  = regexp.MustCompile(`(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)`)
	plainIdent   = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
)

// schemaObjects are the tables and functions the migrations make.
func schemaObjects() (tables, funcs []string, err error) {
	list, err := migrationList()
	if err != nil {
		return nil, nil, err
	}
	seen := map[string]bool{}
	for _, m := range list {
		for _, x := range createdTable.FindAllStringSubmatch(m.sql, -1) {
			if name := strings.ToLower(x[1]); !seen[name] {
				seen[name] = true
				tables = append(tables, name)
			}
		}
		for _, x := range createdFunc.FindAllStringSubmatch(m.sql, -1) {
			if name := strings.ToLower(x[1]); !seen["f:"+name] {
				seen["f:"+name] = true
				funcs = append(funcs, name)
			}
		}
	}
	return tables, funcs, nil
}

// ident quotes name for SQL only when it needs it.
func ident(name string) string {
	if plainIdent.MatchString(name) {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

// rowQuerier is a connection, from the pool or not.
type rowQuerier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// rightsSQL lists, for the tables ($2) and functions ($3) of the schema
// whose namespace is $1, every right the session's role lacks: kind,
// name, right.
const rightsSQL = `WITH t AS (
	SELECT c.oid, c.relname FROM pg_class c
	WHERE c.relnamespace = $1 AND c.relkind IN ('r', 'p') AND c.relname = ANY($2::text[]))
SELECT 'table', t.relname::text, p.r FROM t CROSS JOIN unnest('{SELECT,INSERT,UPDATE,DELETE}'::text[]) AS p(r)
	WHERE NOT has_table_privilege(t.oid, p.r)
UNION ALL
SELECT 'table', c.relname::text, 'SELECT' FROM pg_class c
	WHERE c.relnamespace = $1 AND c.relname = 'breakwater_schema' AND NOT has_table_privilege(c.oid, 'SELECT')
UNION ALL
SELECT DISTINCT 'sequence', s.relname::text, 'USAGE' FROM pg_class s
	JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid AND d.refclassid = 'pg_class'::regclass
	JOIN t ON t.oid = d.refobjid
	WHERE CASE WHEN s.relkind = 'S' THEN NOT has_sequence_privilege(s.oid, 'USAGE') ELSE false END
UNION ALL
SELECT 'function', p.oid::regprocedure::text, 'EXECUTE' FROM pg_proc p
	WHERE p.pronamespace = $1 AND p.proname = ANY($3::text[]) AND NOT has_function_privilege(p.oid, 'EXECUTE')`

// checkRights returns a *RightsError when the session's role lacks a
// right serving needs on the schema that exists (breakwater_schema found
// through the search path); nil when it has them all, or when there are no
// tables yet (making them needs CREATE: checkCreate).
func checkRights(ctx context.Context, q rowQuerier) error {
	var role, database string
	var schema *string
	var nsp *uint32
	err := q.QueryRow(ctx, `SELECT current_user, current_database(), n.nspname::text, n.oid
		FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.oid = (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('breakwater_schema'))`).Scan(&role, &database, &schema, &nsp)
	if err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	if schema == nil {
		// No tables found: perhaps the role may not use the schema that
		// holds them (the search path leaves out such a schema).
		return checkSchemaUsage(ctx, q, role, database)
	}
	tables, funcs, err := schemaObjects()
	if err != nil {
		return err
	}
	rows, err := q.Query(ctx, rightsSQL, *nsp, tables, funcs)
	if err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	defer rows.Close()
	e := &RightsError{Role: role, Database: database}
	kinds := map[string]bool{}
	for rows.Next() {
		var kind, name, right string
		if err := rows.Scan(&kind, &name, &right); err != nil {
			return fmt.Errorf("postgres: read the role's rights: %w", err)
		}
		e.Lacks = append(e.Lacks, right+" on "+kind+" "+name)
		kinds[kind] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	if len(e.Lacks) == 0 {
		return nil
	}
	s, r := ident(*schema), ident(role)
	if kinds["table"] {
		e.Grants = append(e.Grants, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "+s+" TO "+r)
	}
	if kinds["sequence"] {
		e.Grants = append(e.Grants, "GRANT USAGE ON ALL SEQUENCES IN SCHEMA "+s+" TO "+r)
	}
	if kinds["function"] {
		e.Grants = append(e.Grants, "GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "+s+" TO "+r)
	}
	return e
}

// checkSchemaUsage finds the first schema of the search path that exists
// but that the role may not use, and says to grant USAGE on it.
func checkSchemaUsage(ctx context.Context, q rowQuerier, role, database string) error {
	var schema string
	err := q.QueryRow(ctx, `SELECT n.nspname FROM unnest(string_to_array(current_setting('search_path'), ',')) WITH ORDINALITY AS p(name, i)
		JOIN pg_namespace n ON n.nspname = CASE trim(p.name) WHEN '"$user"' THEN current_user::text ELSE trim(both '"' from trim(p.name)) END
		WHERE NOT has_schema_privilege(n.oid, 'USAGE') ORDER BY p.i LIMIT 1`).Scan(&schema)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	var current *string
	if err := q.QueryRow(ctx, "SELECT current_schema()").Scan(&current); err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	if current != nil {
		return nil // an earlier schema of the path is usable: the tables go there
	}
	return &RightsError{Role: role, Database: database,
		Lacks:  []string{"USAGE on schema " + schema},
		Grants: []string{"GRANT USAGE ON SCHEMA " + ident(schema) + " TO " + ident(role)}}
}

// checkCreate returns a *RightsError when the role may not create tables
// in its schema, which making or upgrading the schema (from version
// current to latest) needs.
func checkCreate(ctx context.Context, q rowQuerier, current, latest int) error {
	var role, database string
	var schema *string
	var create bool
	err := q.QueryRow(ctx, `SELECT current_user, current_database(), current_schema(),
		coalesce(current_schema() IS NOT NULL AND has_schema_privilege(current_schema(), 'CREATE'), false)`).Scan(&role, &database, &schema, &create)
	if err != nil {
		return fmt.Errorf("postgres: read the role's rights: %w", err)
	}
	if create {
		return nil
	}
	if schema == nil {
		if err := checkSchemaUsage(ctx, q, role, database); err != nil {
			return err
		}
	}
	s := "public"
	if schema != nil {
		s = *schema
	}
	what := "make the schema"
	if current > 0 {
		what = fmt.Sprintf("upgrade the schema from version %d to %d", current, latest)
	}
	return &RightsError{Role: role, Database: database,
		Lacks:  []string{"CREATE on schema " + s + " (to " + what + ")"},
		Grants: []string{"GRANT CREATE ON SCHEMA " + ident(s) + " TO " + ident(role)},
		Note: "or, keeping this role to its table rights, " + what + " once with the owner's URL " +
			"(start one instance, or run breakwater keys list, with it) and then start this one"}
}

// connectAdvice adds to a failed connection what to grant or size, when
// the server said why: no CONNECT right, or no connection left.
func connectAdvice(err error, role, database string) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	switch pgErr.Code {
	case "42501": // insufficient_privilege: CONNECT
		return fmt.Sprintf("; GRANT CONNECT ON DATABASE %s TO %s (%s)", ident(database), ident(role), RightsDoc)
	case "53300": // too_many_connections
		return "; the server is at max_connections: every instance opens up to storage.postgres_max_connections + 1; " +
			"lower it, run fewer instances or raise max_connections (config check counts them)"
	}
	return ""
}
