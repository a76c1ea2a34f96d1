package store_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/honestcancel/gateway/chat"
	"github.com/honestcancel/gateway/store"
)

// wantMode fails unless path exists with exactly mode.
func wantMode(t *testing.T, path string, mode fs.FileMode) {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Errorf("%s: %v", path, err)
		return
	}
	if got := info.Mode().Perm(); got != mode {
		t.Errorf("%s has mode %v, want %v", filepath.Base(path), got, mode)
	}
}

// openWithAThread opens the database at path exclusively (until the test
// ends) and creates a thread in it, so that it writes its files.
func openWithAThread(t *testing.T, path string) *store.Store {
	t.Helper()
	st, err := store.Open(ctx, path, store.Options{Exclusive: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.CreateThread(ctx, chat.LocalUserID, "t"); err != nil {
		t.Fatal(err)
	}
	return st
}

// A SQLite database the store creates is its owner's alone: the folder
// (and a missing parent) 0700; the file, its -wal and -shm (which SQLite
// creates itself), the .lock and a backup 0600. It holds when the umask
// would allow more.
func TestNewDatabaseFilesArePrivate(t *testing.T) {
	old := syscall.Umask(0) // the loosest: whatever is created gets its mode as asked
	t.Cleanup(func() { syscall.Umask(old) })
	dir := filepath.Join(t.TempDir(), "data", "gw")
	db := filepath.Join(dir, "gateway.db")
	st := openWithAThread(t, db)
	// A second connection's read makes SQLite open the -shm too.
	if _, _, err := st.ListThreads(ctx, chat.LocalUserID, 10, "", ""); err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "backups", "copy.db")
	if err := st.Backup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	wantMode(t, dir, 0o700)
	wantMode(t, filepath.Dir(dir), 0o700)
	for _, f := range []string{db, db + "-wal", db + "-shm", db + ".lock", backup} {
		wantMode(t, f, 0o600)
	}
	wantMode(t, filepath.Dir(backup), 0o700)
	if e, err := store.Exposed(db); err != nil || len(e.Files) != 0 || e.Dir != "" {
		t.Errorf("Exposed(a new database) = %+v, %v; want nothing", e, err)
	}
	// The backup is a database, and refused over an existing file.
	if err := st.Backup(ctx, backup); err == nil {
		t.Error("a second backup to the same file was accepted")
	}
	wantMode(t, backup, 0o600)
	b, err := store.Open(ctx, backup, store.Options{})
	if err != nil {
		t.Fatalf("open the backup: %v", err)
	}
	defer b.Close()
	if threads, _, err := b.ListThreads(ctx, chat.LocalUserID, 10, "", ""); err != nil || len(threads) != 1 {
		t.Errorf("backup holds %d threads (%v), want 1", len(threads), err)
	}
}

// Files and folders that exist are left as they are, and Exposed names
// those others may read: the database (and the -wal and -shm SQLite gives
// its mode), and the folder.
func TestExposedDatabase(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "shared")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // whatever the umask
		t.Fatal(err)
	}
	db := filepath.Join(dir, "gateway.db")
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(db, 0o644); err != nil {
		t.Fatal(err)
	}
	openWithAThread(t, db)
	wantMode(t, db, 0o644)
	wantMode(t, dir, 0o755)
	e, err := store.Exposed(db)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{db, db + "-wal", db + "-shm"}; !slices.Equal(e.Files, want) {
		t.Errorf("exposed files %q, want %q", e.Files, want)
	}
	if e.Dir != dir {
		t.Errorf("exposed folder %q, want %q", e.Dir, dir)
	}
	if e, err := store.Exposed("postgres://gw@db/gw"); err != nil || len(e.Files) != 0 || e.Dir != "" {
		t.Errorf("Exposed(PostgreSQL) = %+v, %v", e, err)
	}
}
