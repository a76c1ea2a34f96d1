// Package store keeps the gateway's state in SQL: threads, checkpoints,
// messages, runs, operations, the per-thread event log, the stream buffer and
// the cancel audit journal. Each exported method owns its transaction.
//
// Writes go through one writer connection and one gate (writer.go): every
// state change of a thread is one transaction that checks and bumps the
// thread's state_version and last_seq and appends its events; after the
// commit, and still holding the gate, the committed events are handed to
// the OnCommit sink, so a thread's events reach subscribers in seq order
// ("persist, then fan out"). Reads use a separate pool and never wait for
// the writer.
//
// The same code serves SQLite (a file path, the default) and PostgreSQL (a
// postgres:// DSN, for several instances sharing one database). On
// PostgreSQL each instance still writes through one connection behind its
// own gate; across instances, a write transaction locks the thread and run
// rows it decides on, a thread before its runs (txn.forUpdate,
// txn.lockRunThread), so the compare-and-set of the thread's sequencer
// never fails spuriously, and a transaction that loses a deadlock or a
// lock wait to another instance runs again (retry.go).
package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	"github.com/jmoiron/sqlx"
	"github.com/mattn/go-sqlite3"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/honestcancel/gateway/chat"
)

// Each database has its own migrations, numbered alike: a goose version is
// its file's number, the same schema on both.
//
//go:embed migrations/sqlite/*.sql migrations/postgres/*.sql
var migrations embed.FS

// Options configure a Store.
type Options struct {
	// OnCommit receives the events of every committed write transaction, in
	// seq order per thread. It is called with the write lock held and must
	// not block or call back into the Store. (SetOnCommit sets it when its
	// receiver is built on the store.)
	OnCommit func(events []*chat.Event)
	// Readers is the size of the read pool (default 4).
	Readers int
	// Exclusive takes an advisory lock on PATH.lock for the store's
	// lifetime, so a second server on the same file fails at start instead
	// of recovering (stealing) the first one's runs. SQLite only: instances
	// sharing PostgreSQL are meant to run side by side.
	Exclusive bool
	// Metrics records transaction latency, group-commit sizes, the stream
	// buffer's size and cancel-to-cancelled latency (nil: nothing is
	// recorded, and Open does not count the stream buffer).
	Metrics Metrics
	// Clock is this process's time (nil: time.Now): the timestamps it
	// writes and, on SQLite, the time leases are granted and judged by.
	// On PostgreSQL leases always follow the database's clock, so that
	// instances whose clocks differ agree on when a lease expired.
	Clock func() time.Time
	// MaxRunsPerUser is one user's share of the workers (docs/protocol.md
	// "Admission"): a claim skips a queued run of a user who has that many
	// runs executing, on any instance, and takes the next one in line. Runs
	// handed over between steps are not counted against it when claimed:
	// they were admitted before. 0: no share.
	MaxRunsPerUser int
	// ReconcileHorizon is how long the outcome of a call left unknown is
	// looked up by its key before the gateway gives up asking and says so
	// (default 24h; see reconcile.go).
	ReconcileHorizon time.Duration
	// Synchronous is SQLite's synchronous setting for the writer
	// connection: SynchronousFull or SynchronousNormal ("" is
	// DefaultSynchronous; see SQLiteSynchronous). It decides whether an
	// acknowledged commit survives an OS crash or power loss (full) or only
	// a crash of the process (normal). SQLite only: on PostgreSQL
	// durability is the server's synchronous_commit, and this is ignored.
	Synchronous string
	// StreamBuffer fans deltas out on PostgreSQL before they are written,
	// as on SQLite with Exclusive (streambuf.go). Instances sharing the
	// database must then be able to ask each other for a thread: give each
	// store the others' StreamPeers (SetStreamPeers) before it serves. A
	// store without peers writes past another process's reservation at
	// once, recording it as lost. Ignored on SQLite, where Exclusive
	// decides.
	StreamBuffer bool
}

// SQLite synchronous settings (Options.Synchronous).
const (
	// SynchronousFull: every commit's WAL frames are synced to the disk
	// (fsync) before the commit returns, so before anything acknowledges
	// it. An OS crash or power loss loses no acknowledged commit, as far as
	// the disk honours fsync.
	SynchronousFull = "full"
	// SynchronousNormal: commits reach the WAL file in the OS's cache; the
	// WAL is synced only at checkpoints. A process crash loses nothing; an
	// OS crash or power loss can roll back the commits since the last
	// sync, the last acknowledged ones included (whole transactions: the
	// database comes back consistent, as of an earlier moment).
	SynchronousNormal = "normal"
	// DefaultSynchronous is used when Options.Synchronous is "": full,
	// because with group commit its cost showed only with the writer
	// saturated (fewer deltas per second, a longer wait for a new run's
	// first word), not in cancel latency (BENCHMARKS.md as of 6e7e314).
	DefaultSynchronous = SynchronousFull
)

// SQLiteSynchronous checks a synchronous setting ("" for the default,
// any letter case) and returns it as SQLite names it in a DSN's
// _synchronous parameter: FULL or NORMAL.
func SQLiteSynchronous(setting string) (string, error) {
	switch v := strings.ToLower(strings.TrimSpace(setting)); v {
	case "":
		return strings.ToUpper(DefaultSynchronous), nil
	case SynchronousFull, SynchronousNormal:
		return strings.ToUpper(v), nil
	default:
		return "", fmt.Errorf(
			"SQLite synchronous %q is not a setting: use full (acknowledged commits survive an OS crash or power "+
				"loss) or normal (they survive a crash of the process only)",
			setting,
		)
	}
}

// Store is safe for concurrent use. Close it once, after every user stopped.
type Store struct {
	writer   *sqlx.DB
	reader   *sqlx.DB
	gate     *writerGate                         // taken for every write transaction (writer.go)
	queue    writeQueue                          // group commit of AppendDeltas (group.go)
	onCommit atomic.Pointer[func([]*chat.Event)] // never nil after Open
	metrics  Metrics
	lock     *os.File
	pg       bool        // PostgreSQL, not SQLite
	cps      *chainCache // checkpoints' lists as stored (checkpoints.go)
	// deltas fanned out before written (SQLite with Exclusive, PostgreSQL with StreamBuffer); nil otherwise
	buf     *streamBuffer
	journal *cancelJournal           // cancels acknowledged before the writer records them (SQLite with Exclusive; nil otherwise)
	path    string                   // the SQLite file ("" on PostgreSQL)
	peers   atomic.Pointer[peersBox] // other instances holding threads (PostgreSQL, SetStreamPeers)
	retries atomic.Int64             // transactions run again (retry.go)
	clock   func() time.Time
	horizon time.Duration // Options.ReconcileHorizon
	perUser int           // Options.MaxRunsPerUser
	// queueStarts is signalled (cap 1, never blocking) after a commit
	// that started a run from a thread's message queue (QueueStarts).
	queueStarts chan struct{}
}

// IsPostgres reports whether dsn names a PostgreSQL database (a postgres://
// or postgresql:// URL) rather than a SQLite file.
func IsPostgres(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// Open opens the database named by dsn and runs the embedded migrations: a
// postgres:// or postgresql:// URL is a PostgreSQL database (pgx); anything
// else is the path of a SQLite file, created if needed (see FileMode).
func Open(ctx context.Context, dsn string, opts Options) (*Store, error) {
	if IsPostgres(dsn) {
		return openPostgres(ctx, dsn, opts)
	}
	if _, err := SQLiteSynchronous(opts.Synchronous); err != nil {
		return nil, err
	}
	path := dsn
	if err := createPrivate(path); err != nil {
		return nil, err
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
	st.path = path
	if opts.Exclusive {
		// This process is the database's only writer: deltas may be
		// fanned out before they are written (streambuf.go). What a
		// previous process handed out and never wrote is recorded first.
		if _, err := recoverStream(ctx, st); err != nil {
			st.Close()
			return nil, err
		}
		// Then the cancels a previous process acknowledged from its
		// journal and did not record (canceljournal.go).
		j, recs, err := openCancelJournal(path)
		if err != nil {
			st.Close()
			return nil, err
		}
		st.journal = j
		if err := st.replayJournal(ctx, recs); err != nil {
			st.Close()
			return nil, err
		}
		st.buf = newStreamBuffer(st)
		j.start(st)
	}
	return st, nil
}

// lockFile takes an exclusive advisory lock, released when the file closes
// (also when the process dies).
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, FileMode)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf(
			"database %s is in use by another gateway process: stop it or pass another -db",
			strings.TrimSuffix(path, ".lock"),
		)
	}
	return f, nil
}

func open(ctx context.Context, path string, opts Options) (*Store, error) {
	synchronous, err := SQLiteSynchronous(opts.Synchronous)
	if err != nil {
		return nil, err
	}
	base := "file:" + (&url.URL{Path: path}).EscapedPath()
	if err := formatNew(ctx, path, base); err != nil {
		return nil, err
	}
	writer, err := sqlx.Open(
		"sqlite3",
		base+"?_journal_mode=WAL&_busy_timeout=5000&_foreign_keys=on&_synchronous="+synchronous+
			"&_txlock=immediate&_stmt_cache_size=128",
	)
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
	if err := migrate(ctx, writer.DB, goose.DialectSQLite3, "migrations/sqlite", nil); err != nil {
		writer.Close()
		return nil, err
	}
	reader, err := sqlx.Open(
		"sqlite3",
		base+"?_journal_mode=WAL&_busy_timeout=5000&_foreign_keys=on&_query_only=1&_stmt_cache_size=64",
	)
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	return newStore(ctx, writer, reader, opts, false)
}

// PageSize is the page size of a SQLite database this package creates, in
// bytes. SQLite writes whole pages: a commit appends every page it changed
// to the WAL, and a checkpoint copies them into the database file. One
// exchange changes a row or an index entry in some 25 tables and indexes,
// so the page, not the row, sets what it writes: 212 KiB an exchange with
// SQLite's default of 4,096 bytes, 70 KiB with 1,024 (BENCHMARKS.md, the
// long scenario). Smaller pages than 1,024 made deeper trees and wrote
// more per exchange as the conversation grew.
const PageSize = 1024

// formatNew gives a database file that holds nothing yet (createPrivate
// just made it) PageSize and WAL mode, before the writer's connection
// would give it SQLite's default page size: a page size is fixed once a
// database is in WAL mode. A database that exists keeps its page size;
// only a VACUUM in rollback mode changes it.
func formatNew(ctx context.Context, path, base string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	if fi.Size() > 0 {
		return nil
	}
	if _, err := os.Stat(path + "-wal"); err == nil {
		return nil // its first pages are in the WAL: not new
	}
	db, err := sqlx.Open("sqlite3", base+"?_busy_timeout=5000")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer db.Close()
	// One connection: both pragmas must reach the same one.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA page_size = %d", PageSize)); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := db.ExecContext(ctx, "PRAGMA journal_mode = WAL"); err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	return nil
}

// newStore sizes the read pool and completes the Store around its two
// handles; it closes both when it fails.
func newStore(ctx context.Context, writer, reader *sqlx.DB, opts Options, pg bool) (*Store, error) {
	n := opts.Readers
	if n <= 0 {
		n = 4
	}
	reader.SetMaxOpenConns(n)
	reader.SetMaxIdleConns(n)
	var metrics Metrics = noMetrics{}
	if opts.Metrics != nil {
		// The stream buffer's size is kept up to date from here on by the
		// commits that add or purge deltas (no count per scrape).
		var n int64
		if err := reader.GetContext(ctx, &n, `SELECT COALESCE(SUM(last_seq - first_seq + 1), 0)
			FROM stream_batches`); err != nil {
			reader.Close()
			writer.Close()
			return nil, fmt.Errorf("count the stream buffer: %w", err)
		}
		metrics = opts.Metrics
		metrics.StreamBuffered(n)
	}
	clock := opts.Clock
	if clock == nil {
		clock = time.Now
	}
	horizon := opts.ReconcileHorizon
	if horizon <= 0 {
		horizon = DefaultReconcileHorizon
	}
	st := &Store{
		writer:  writer,
		reader:  reader,
		metrics: metrics,
		pg:      pg,
		clock:   clock,
		horizon: horizon,
		perUser: max(opts.MaxRunsPerUser, 0),
		cps:     newChainCache(chainCacheWeight),

		queueStarts: make(chan struct{}, 1),
	}
	st.SetOnCommit(opts.OnCommit)
	st.gate = newWriterGate(&st.queue.waiting)
	return st, nil
}

// SetOnCommit replaces Options.OnCommit (nil: events go nowhere). For a
// receiver built on the store (the event bus reads it): set it before the
// first write that matters to it; a transaction committing meanwhile hands
// its events to the old or the new one.
func (s *Store) SetOnCommit(fn func(events []*chat.Event)) {
	if fn == nil {
		fn = func([]*chat.Event) {}
	}
	s.onCommit.Store(&fn)
}

// published hands committed events to OnCommit.
func (s *Store) published(events []*chat.Event) { (*s.onCommit.Load())(events) }

// Postgres reports whether the store is on PostgreSQL.
func (s *Store) Postgres() bool { return s.pg }

// sessionLimits bound how long one instance can hold up another on
// PostgreSQL, unless the URL sets them itself. An instance frozen in the
// middle of a transaction (stopped, partitioned) keeps its row locks: after
// idle_in_transaction_session_timeout PostgreSQL ends its session and
// frees them. Meanwhile a transaction waiting for such a lock gives up
// after lock_timeout and runs again (retry.go), txAttempts times, which
// outlasts the idle timeout. The idle timeout stays well under the default
// lease TTL (15 s): an instance whose single writer waits behind a frozen
// one cannot renew its own leases meanwhile, and a stall longer than its
// lease would hand its live runs to others. (The gateway's transactions
// are never idle for long: they do no network calls but the database's.)
var sessionLimits = [][2]string{
	{"lock_timeout", "2s"},
	{"idle_in_transaction_session_timeout", "5s"},
}

// withSessionLimits adds sessionLimits to a PostgreSQL URL as runtime
// parameters where it does not set them.
func withSessionLimits(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", fmt.Errorf("-db is not a valid PostgreSQL URL: %w", err)
	}
	q := u.Query()
	for _, kv := range sessionLimits {
		if !q.Has(kv[0]) {
			q.Set(kv[0], kv[1])
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// openPostgres opens a PostgreSQL store: one writer connection (the same
// single-writer design as SQLite, per instance) and a read pool, both
// through pgx's database/sql driver under the name "pgx", for which sqlx
// rebinds ? to $n.
func openPostgres(ctx context.Context, dsn string, opts Options) (*Store, error) {
	dsn, err := withSessionLimits(dsn)
	if err != nil {
		return nil, err
	}
	if err := migratePostgres(ctx, dsn); err != nil {
		return nil, err
	}
	writer, err := sqlx.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open PostgreSQL: %w", err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	if err := writer.PingContext(ctx); err != nil {
		writer.Close()
		return nil, fmt.Errorf("open PostgreSQL: %w", err)
	}
	reader, err := sqlx.Open("pgx", dsn)
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("open PostgreSQL for reading: %w", err)
	}
	st, err := newStore(ctx, writer, reader, opts, true)
	if err != nil {
		return nil, err
	}
	if opts.StreamBuffer {
		st.buf = newStreamBuffer(st)
	}
	return st, nil
}

// migratePostgres runs the PostgreSQL migrations on a connection pool of
// their own, under goose's session lock (a PostgreSQL advisory lock), so
// instances starting at once migrate once: the others wait for the lock
// and then find nothing to do. The lock's id is derived from the database
// and schema, so separate schemas of one server do not wait for each other.
func migratePostgres(ctx context.Context, dsn string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return fmt.Errorf("open PostgreSQL: %w", err)
	}
	defer db.Close()
	var where string
	if err := db.QueryRowContext(ctx, `SELECT current_database() || '.' || COALESCE(current_schema(),
		'')`).Scan(&where); err != nil {
		return fmt.Errorf("open PostgreSQL: %w", err)
	}
	h := fnv.New64a()
	h.Write([]byte("honestcancel-gateway-migrate:" + where))
	// Retried every second for up to five minutes (a long migration of
	// another instance).
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64()>>1)), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return migrate(ctx, db, goose.DialectPostgres, "migrations/postgres", locker)
}

func migrate(ctx context.Context, db *sql.DB, dialect goose.Dialect, dir string, locker lock.SessionLocker) error {
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		return err
	}
	var opts []goose.ProviderOption
	if locker != nil {
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(dialect, db, sub, opts...)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// storeCloseTimeout bounds the writes Close makes.
const storeCloseTimeout = 30 * time.Second

// Close records the journaled cancels (canceljournal.go), writes the
// deltas still in memory and gives back the seqs reserved for them
// (streambuf.go), then closes both pools and releases the lock.
// Nothing may stream (AppendDeltas) once Close is called.
func (s *Store) Close() error {
	var err error
	if s.journal != nil {
		err = s.journal.close(s)
	}
	if s.buf != nil {
		ctx, cancel := context.WithTimeout(context.Background(), storeCloseTimeout)
		err = errors.Join(err, s.buf.close(ctx))
		cancel()
		s.buf = nil
	}
	err = errors.Join(err, s.reader.Close(), s.writer.Close())
	if s.lock != nil {
		err = errors.Join(err, s.lock.Close())
	}
	return err
}

// write runs fn in one immediate transaction on the writer connection and,
// after a successful commit, hands the transaction's events to OnCommit.
// (Stream writes and cancels go through the group-commit queue instead,
// see group.go.) A transaction that another instance's made fail (a
// deadlock or serialization failure on PostgreSQL) runs again from scratch,
// fn included, a few times: fn must keep its results in variables it sets
// afresh on every call, and do nothing outside the transaction.
func (s *Store) write(ctx context.Context, fn func(t *txn) error) error {
	return s.acrossHolders(ctx, func(ctx context.Context) error { return s.writeRetrying(ctx, fn) })
}

func (s *Store) writeRetrying(ctx context.Context, fn func(t *txn) error) error {
	for attempt := 1; ; attempt++ {
		err := s.writeOnce(ctx, fn)
		if attempt >= txAttempts || !retryable(err) {
			return err
		}
		s.retries.Add(1)
		if err := backoff(ctx, attempt); err != nil {
			return err
		}
	}
}

func (s *Store) writeOnce(ctx context.Context, fn func(t *txn) error) error {
	s.gate.lock()
	defer s.gate.unlock()
	defer s.observe(txWrite, time.Now())
	tx, err := s.writer.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	t := s.newTxn(ctx, tx)
	t.pastOK = pastFrom(ctx)
	turn := s.journal.beginBody()
	defer turn.end(false) // unless committed
	err = turn.apply(t)
	if err == nil {
		err = fn(t)
	}
	if err != nil {
		_ = tx.Rollback()
		t.endStreams(false)
		return err
	}
	if err := t.flushThreads(); err != nil {
		_ = tx.Rollback()
		t.endStreams(false)
		return err
	}
	turn.commitStarts(t)
	if err := tx.Commit(); err != nil {
		t.endStreams(false)
		return fmt.Errorf("commit: %w", err)
	}
	s.committedLocked(t)
	t.endStreams(true)
	turn.end(true)
	return nil
}

// read runs fn in one read transaction: a consistent view of the database
// (on PostgreSQL a read-only REPEATABLE READ transaction: one snapshot for
// every statement).
func (s *Store) read(ctx context.Context, fn func(q *sqlx.Tx) error) error {
	defer s.observe(txRead, time.Now())
	var opts *sql.TxOptions
	if s.pg {
		opts = &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}
	}
	tx, err := s.reader.BeginTxx(ctx, opts)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only
	return fn(tx)
}

func isUniqueViolation(err error) bool {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.ExtendedCode == sqlite3.ErrConstraintUnique
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
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
// snapshot and writes a compact file, with PageSize pages. On PostgreSQL
// it refuses: pg_dump is the tool for that.
func (s *Store) Backup(ctx context.Context, dest string) error {
	if s.pg {
		return errors.New(
			"backup copies SQLite files only: back up a PostgreSQL database with pg_dump (e.g. pg_dump -Fc -f OUT DSN)",
		)
	}
	if err := s.settled(ctx); err != nil { // the cancels acknowledged so far are in the copy
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dest), DirMode); err != nil {
		return fmt.Errorf("create backup folder: %w", err)
	}
	// VACUUM INTO writes into an empty file as into a new one, and keeps
	// the mode of the file it finds: create it here, private, and only if
	// it does not exist yet (O_EXCL: never over another file).
	f, err := os.OpenFile(dest, os.O_RDWR|os.O_CREATE|os.O_EXCL, FileMode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists: pick a new file name", dest)
	}
	if err != nil {
		return fmt.Errorf("create backup file: %w", err)
	}
	f.Close()
	// The copy gets PageSize pages whatever the database has: a database
	// created before PageSize was 1,024 becomes one by a backup restored
	// (docs/operations.md). This sets only what VACUUM INTO writes: a
	// database in WAL mode keeps its own page size.
	if _, err := s.writer.ExecContext(ctx, fmt.Sprintf("PRAGMA page_size = %d", PageSize)); err != nil {
		os.Remove(dest)
		return fmt.Errorf("back up to %s: %w", dest, err)
	}
	if _, err := s.writer.ExecContext(ctx, `VACUUM INTO ?`, dest); err != nil {
		os.Remove(dest)
		return fmt.Errorf("back up to %s: %w", dest, err)
	}
	return nil
}
