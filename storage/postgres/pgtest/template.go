package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// template is a database that prepare made once for this test binary,
// which NewDatabaseFrom copies.
type template struct {
	once sync.Once
	name string
	err  error
}

var (
	templatesMu sync.Mutex
	templates   = map[string]*template{}
)

// NewDatabaseFrom is NewDatabase with the new database a copy of the
// template named key: a database that prepare (given its URL) made once
// for this test binary, on the first call with key. A test whose database
// would otherwise start with the same costly work (the migrations of
// postgres.Open) starts from the copy; prepare must leave no session on
// the template. The templates are dropped by Main.
func NewDatabaseFrom(t testing.TB, key string, prepare func(url string) error) string {
	t.Helper()
	admin := ServerURL(t)
	templatesMu.Lock()
	tm := templates[key]
	if tm == nil {
		tm = &template{}
		templates[key] = tm
	}
	templatesMu.Unlock()
	tm.once.Do(func() {
		name := randomName("bw_template_")
		if tm.err = execAdmin(admin, "CREATE DATABASE "+name); tm.err != nil {
			return
		}
		tm.name = name
		tm.err = prepare(databaseURL(admin, name))
	})
	if tm.err != nil {
		t.Fatalf("pgtest: prepare the template %s: %v", key, tm.err)
	}
	return newDatabase(t, admin, " TEMPLATE "+tm.name)
}

// dropTemplates drops the templates NewDatabaseFrom made, when the server
// still runs (a server Main started is removed whole).
func dropTemplates() {
	templatesMu.Lock()
	defer templatesMu.Unlock()
	if serverURL == "" || serverStop != nil {
		return
	}
	for _, tm := range templates {
		if tm.name != "" {
			_ = execAdmin(serverURL, "DROP DATABASE IF EXISTS "+tm.name+" WITH (FORCE)")
		}
	}
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func databaseURL(admin, name string) string {
	u, err := url.Parse(admin)
	if err != nil {
		return admin
	}
	u.Path = "/" + name
	return u.String()
}

// execAdmin runs one statement on the admin URL's database. A template
// whose last session is still ending is retried for a few seconds.
func execAdmin(admin, sql string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		_, err = conn.Exec(ctx, sql)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" || ctx.Err() != nil { // object_in_use
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
