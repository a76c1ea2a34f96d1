// Package store keeps the gateway's state in SQL: threads, checkpoints,
// messages, runs, operations, the per-thread event log, the stream buffer and
// the cancel audit journal. Each exported method owns its transaction.
//
// Writes go through one writer connection and one Go mutex: every state
// change of a thread is one transaction that checks and bumps the thread's
// state_version and last_seq and appends its events; after the commit, and
// still under the mutex, the committed events are handed to the OnCommit sink,
// so a thread's events reach subscribers in seq order ("persist, then fan
// out"). Reads use a separate pool and never wait for the writer.
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/mattn/go-sqlite3"
	"github.com/pressly/goose/v3"

	"github.com/honestcancel/gateway/chat"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Options configure a Store.
type Options struct {
	// OnCommit receives the events of every committed write transaction, in
	// seq order per thread. It is called with the write lock held and must
	// not block or call back into the Store.
	OnCommit func(events []*chat.Event)
	// Readers is the size of the read pool (default 4).
	Readers int
	// Exclusive takes an advisory lock on PATH.lock for the store's
	// lifetime, so a second server on the same file fails at start instead
	// of recovering (stealing) the first one's runs.
	Exclusive bool
	// Metrics records transaction latency, group-commit sizes, the stream
	// buffer's size and cancel-to-cancelled latency (nil: nothing is
	// recorded, and Open does not count the stream buffer).
	Metrics Metrics
}

// Store is safe for concurrent use. Close it once, after every user stopped.
type Store struct {
	writer   *sqlx.DB
	reader   *sqlx.DB
	writeMu  sync.Mutex
	queue    writeQueue // group commit of AppendDeltas (group.go)
	onCommit func([]*chat.Event)
	metrics  Metrics
	lock     *os.File
}

// Open opens (creating if needed) the SQLite database at path and runs the
// embedded migrations.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if dir := filepath.Dir(path); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create database folder: %w", err)
		}
	}
	var lock *os.File
	if opts.Exclusive {
		var err error
		if lock, err = lockFile(path + ".lock"); err != nil {
			return nil, err
		}
	}
	st, err := open(ctx, path, opts)
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		return nil, err
	}
	st.lock = lock
	return st, nil
}

// lockFile takes an exclusive advisory lock, released when the file closes
// (also when the process dies).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("database %s is in use by another gateway process: stop it or pass another -db", strings.TrimSuffix(path, ".lock"))
	}
	return f, nil
}

func open(ctx context.Context, path string, opts Options) (*Store, error) {
	base := "file:" + (&url.URL{Path: path}).EscapedPath()
	writer, err := sqlx.Open("sqlite3", base+"?_journal_mode=WAL&_busy_timeout=5000&_foreign_keys=on&_synchronous=NORMAL&_txlock=immediate&_stmt_cache_size=128")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := migrate(ctx, writer.DB); err != nil {
		writer.Close()
		return nil, err
	}
	reader, err := sqlx.Open("sqlite3", base+"?_journal_mode=WAL&_busy_timeout=5000&_foreign_keys=on&_query_only=1&_stmt_cache_size=64")
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	n := opts.Readers
	if n <= 0 {
		n = 4
	}
	reader.SetMaxOpenConns(n)
	reader.SetMaxIdleConns(n)
	onCommit := opts.OnCommit
	if onCommit == nil {
		onCommit = func([]*chat.Event) {}
	}
	var metrics Metrics = noMetrics{}
	if opts.Metrics != nil {
		// The stream buffer's size is kept up to date from here on by the
		// commits that add or purge deltas (no count per scrape).
		var n int64
		if err := reader.GetContext(ctx, &n, `SELECT COUNT(*) FROM stream_deltas`); err != nil {
			reader.Close()
			writer.Close()
			return nil, fmt.Errorf("count the stream buffer: %w", err)
		}
		metrics = opts.Metrics
		metrics.StreamBuffered(n)
	}
	return &Store{writer: writer, reader: reader, onCommit: onCommit, metrics: metrics}, nil
}

func migrate(ctx context.Context, db *sql.DB) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, sub)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Close closes both pools and releases the lock.
func (s *Store) Close() error {
	err := errors.Join(s.reader.Close(), s.writer.Close())
	if s.lock != nil {
		err = errors.Join(err, s.lock.Close())
	}
	return err
}

// write runs fn in one immediate transaction on the writer connection and,
// after a successful commit, hands the transaction's events to OnCommit.
// (Stream writes and cancels go through the group-commit queue instead,
// see group.go.)
func (s *Store) write(ctx context.Context, fn func(t *txn) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	defer s.observe(txWrite, time.Now())
	tx, err := s.writer.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	t := &txn{ctx: ctx, tx: tx, now: time.Now(), threads: map[string]*threadCursor{}}
	if err := fn(t); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := t.flushThreads(); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	s.committedLocked(t)
	return nil
}

// read runs fn in one read transaction: a consistent view of the database.
func (s *Store) read(ctx context.Context, fn func(q *sqlx.Tx) error) error {
	defer s.observe(txRead, time.Now())
	tx, err := s.reader.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	return fn(tx)
}

func isUniqueViolation(err error) bool {
	var se sqlite3.Error
	return errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintUnique
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMS(v int64) time.Time { return time.UnixMilli(v).UTC() }

func fromNullMS(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMS(v.Int64)
	return &t
}

func fromNullString(v sql.NullString) *string {
	if !v.Valid {
		return nil
	}
	s := v.String
	return &s
}

// Backup writes a consistent copy of the database to dest (which must not
// exist) while the database may be serving: SQLite's VACUUM INTO reads one
// snapshot and writes a compact file.
func (s *Store) Backup(ctx context.Context, dest string) error {
	if _, err := os.Stat(dest); err == nil {
		return fmt.Errorf("%s already exists: pick a new file name", dest)
	}
	if dir := filepath.Dir(dest); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("create backup folder: %w", err)
		}
	}
	if _, err := s.writer.ExecContext(ctx, `VACUUM INTO ?`, dest); err != nil {
		return fmt.Errorf("back up to %s: %w", dest, err)
	}
	return nil
}
