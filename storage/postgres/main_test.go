package postgres_test

import (
	"os"
	"testing"

	"breakwater/storage/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
