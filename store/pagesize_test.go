package store_test

import (
	"path/filepath"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/store"
)

// pageSize is PRAGMA page_size of the SQLite file at path, read on a
// connection of its own.
func pageSize(t *testing.T, path string) int {
	t.Helper()
	var n int
	if err := rawDB(t, path).QueryRow("PRAGMA page_size").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A database the store creates has store.PageSize pages and is in WAL mode
// (the page size must be set before WAL is); its backup keeps the page size.
func TestNewDatabaseHasTheStoresPageSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.CreateThread(ctx, user, "t"); err != nil {
		t.Fatal(err)
	}
	if got := pageSize(t, path); got != store.PageSize {
		t.Fatalf("page_size %d, want %d", got, store.PageSize)
	}
	raw := rawDB(t, path)
	var mode string
	if err := raw.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q (%v), want wal", mode, err)
	}
	backup := filepath.Join(t.TempDir(), "copy.db")
	if err := st.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if got := pageSize(t, backup); got != store.PageSize {
		t.Fatalf("the backup's page_size %d, want %d", got, store.PageSize)
	}
}

// A database created before (SQLite's default of 4,096 bytes, in WAL mode,
// with a thread in it) keeps its page size and its data: the store opens it,
// migrates it, reads and writes it. Its backup has the store's page size.
func TestExistingDatabaseKeepsItsPageSize(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gw.db")
	db, err := sqlx.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	for _, q := range []string{"PRAGMA page_size = 4096", "PRAGMA journal_mode = WAL"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()

	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	th, err := st.CreateThread(ctx, user, "before")
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	if got := pageSize(t, path); got != 4096 {
		t.Fatalf("page_size %d after the store wrote, want 4096 as created", got)
	}
	st, err = store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.Thread(ctx, user, th.ThreadID)
	if err != nil || got.Title != "before" {
		t.Fatalf("the thread after a reopen: %+v, %v", got, err)
	}
	if got := pageSize(t, path); got != 4096 {
		t.Fatalf("page_size %d after a reopen, want 4096", got)
	}

	// Its backup has store.PageSize pages and the same conversation: the
	// way docs/operations.md gives to move an older database to them.
	backup := filepath.Join(t.TempDir(), "copy.db")
	if err := st.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	if got := pageSize(t, backup); got != store.PageSize {
		t.Fatalf("the backup's page_size %d, want %d", got, store.PageSize)
	}
	if got := pageSize(t, path); got != 4096 {
		t.Fatalf("the database's page_size %d after its backup, want 4096", got)
	}
	restored, err := store.Open(ctx, backup, store.Options{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	defer restored.Close()
	copied, err := restored.Thread(ctx, user, th.ThreadID)
	if err != nil || copied.Title != "before" || copied.StateVersion != got.StateVersion {
		t.Fatalf("the thread in the backup: %+v, %v; want %+v", copied, err, got)
	}
	if _, err := restored.CreateThread(ctx, user, "after"); err != nil {
		t.Fatal(err)
	}
	if got := pageSize(t, backup); got != store.PageSize {
		t.Fatalf("the restored copy's page_size %d after a write, want %d", got, store.PageSize)
	}
}
