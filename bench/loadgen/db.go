package loadgen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/honestcancel/gateway/store"

	_ "github.com/jackc/pgx/v5/stdlib" // the gateway's PostgreSQL driver ("pgx"), for the cluster scenario's database
	_ "github.com/mattn/go-sqlite3"    // the gateway's own SQLite driver, to read its database after the run
)

// openRead opens a gateway's database for reading after (or, on
// PostgreSQL, during) a run.
func openRead(db string) (*sql.DB, error) {
	if store.IsPostgres(db) {
		conn, err := sql.Open("pgx", db)
		if err == nil {
			conn.SetMaxOpenConns(8)
		}
		return conn, err
	}
	return sql.Open("sqlite3", "file:"+db+"?mode=ro&_busy_timeout=5000")
}

// rebind turns the ? placeholders of query into $1, $2 … for PostgreSQL
// (the queries here hold no ? elsewhere).
func rebind(db, query string) string {
	if !store.IsPostgres(db) {
		return query
	}
	return sqlx.Rebind(sqlx.DOLLAR, query)
}

// redactDB is db as it may appear in a report: a PostgreSQL URL without
// its password.
func redactDB(db string) string {
	if !store.IsPostgres(db) {
		return db
	}
	if u, err := url.Parse(db); err == nil {
		return u.Redacted()
	}
	return "postgres://…"
}

// storeStats is what the gateway's database says about one window
// [from, to) in Unix milliseconds (the ts the store stamps on every event
// and delta: the start time of the transaction that wrote it).
type storeStats struct {
	Deltas      int64 // deltas in stream_batches rows: message.delta events committed
	DeltaMillis int64 // distinct ts among the rows: a lower bound on delta transactions
	// stream_batches rows: per-run batches (AppendDeltas calls); one transaction each
	// without group commit
	RunBatches int64
	Durable    int64 // events rows: durable events committed
	DurableTx  int64 // distinct (thread, ts) among them: about one per durable transaction
}

// readStoreStats reads the stopped gateway's database.
func readStoreStats(ctx context.Context, db string, from, to int64) (storeStats, error) {
	var st storeStats
	conn, err := openRead(db)
	if err != nil {
		return st, err
	}
	defer conn.Close()
	queries := []struct {
		q   string
		dst []any
	}{
		{
			`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0), COUNT(DISTINCT ts), COUNT(*) FROM {stream} AS b
			WHERE ts >= ? AND ts < ?`,
			[]any{&st.Deltas, &st.DeltaMillis, &st.RunBatches},
		},
		{`SELECT COUNT(*) FROM events WHERE ts >= ? AND ts < ?`, []any{&st.Durable}},
		{
			`SELECT COUNT(*) FROM (SELECT 1 FROM events WHERE ts >= ? AND ts < ? GROUP BY thread_id, ts) AS t`,
			[]any{&st.DurableTx},
		},
	}
	stream := streamTable(ctx, conn)
	for _, q := range queries {
		if err := conn.QueryRowContext(
			ctx, rebind(db, strings.ReplaceAll(q.q, "{stream}", stream)), from, to,
		).Scan(q.dst...); err != nil {
			return st, fmt.Errorf("read %s: %w", redactDB(db), err)
		}
	}
	return st, nil
}

// publishGaps reads, for assistant messages published in [from, to), the
// time from the transaction of the message's last delta to the one that
// published it, as the store stamped them (ms resolution): the engine's
// step from the end of the stream to publish + checkpoint, including the
// wait for the writer.
func publishGaps(ctx context.Context, db string, from, to int64) ([]int32, error) {
	return gaps(ctx, db, `SELECT e.ts - (SELECT MAX(d.ts
		+ COALESCE(CAST(json_extract(NULLIF(d.ts_offsets, ''), '$[#-1]') AS INTEGER), 0))
		FROM {stream} d WHERE d.message_id = e.message_id)
		FROM events e WHERE e.type = 'message.published' AND e.run_id IS NOT NULL AND e.ts >= ? AND e.ts < ?
		AND EXISTS (SELECT 1 FROM {stream} d WHERE d.message_id = e.message_id)`, from, to)
}

// cancelGaps reads, for runs whose cancel was recorded in [from, to), the
// time from the run.cancel_requested event to the run.cancelled event as
// the store stamped them (ms resolution): the engine's share of a cancel,
// without the WebSocket hops and the wait for the writer before the
// cancel's own transaction.
func cancelGaps(ctx context.Context, db string, from, to int64) ([]int32, error) {
	return gaps(
		ctx, db,
		`SELECT c.ts - r.ts FROM events r JOIN events c ON c.run_id = r.run_id AND c.type = 'run.cancelled'
		WHERE r.type = 'run.cancel_requested' AND r.ts >= ? AND r.ts < ?`,
		from, to,
	)
}

// firstDeltaGaps reads, for runs started in [from, to) that streamed, the
// time from their run.started event (the run's creation) to their first
// delta as the store stamped them (ms resolution): queueing, the claim,
// the model's first word (one pace of the demo model) and the writes
// between, each waiting for the writer.
func firstDeltaGaps(ctx context.Context, db string, from, to int64) ([]int32, error) {
	return gaps(ctx, db, `SELECT f.first_ts - e.ts `+firstDeltaFrom, from, to)
}

// firstDeltaFrom is the FROM and WHERE of firstDeltaGaps and
// firstDeltaRuns.
const firstDeltaFrom = `FROM events e
		JOIN (SELECT run_id, MIN(ts) AS first_ts FROM {stream} AS b GROUP BY run_id) f ON f.run_id = e.run_id
		WHERE e.type = 'run.started' AND e.ts >= ? AND e.ts < ?`

// firstDeltaRuns is firstDeltaGaps with each figure's run.
func firstDeltaRuns(ctx context.Context, db string, from, to int64) ([]runGap, error) {
	conn, err := openRead(db)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	query := strings.ReplaceAll(
		`SELECT e.run_id, f.first_ts - e.ts `+firstDeltaFrom,
		"{stream}", streamTable(ctx, conn),
	)
	rows, err := conn.QueryContext(ctx, rebind(db, query), from, to)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", redactDB(db), err)
	}
	defer rows.Close()
	var out []runGap
	for rows.Next() {
		var g runGap
		var ms int64
		if err := rows.Scan(&g.runID, &ms); err != nil {
			return nil, err
		}
		g.us = int32(ms * 1000)
		out = append(out, g)
	}
	return out, rows.Err()
}

// streamTable is what the queries here read as {stream}: the gateway's
// stream buffer, one row per batch of deltas (stream_batches), or, in a
// database of a gateway from before batches, its one row per delta
// (stream_deltas) in the same shape, so the generator can measure older
// code side by side.
func streamTable(ctx context.Context, conn *sql.DB) string {
	var one int
	err := conn.QueryRowContext(ctx, `SELECT 1 FROM stream_batches LIMIT 1`).Scan(&one)
	if err == nil || errors.Is(err, sql.ErrNoRows) {
		return "stream_batches"
	}
	return `(SELECT seq AS first_seq, seq AS last_seq, run_id, message_id, ts, '' AS ts_offsets FROM stream_deltas)`
}

// storeGaps reads one of the figures above over the window [w0, w1); when
// the database cannot answer it, notes says which figures are missing and
// why, and the figures are empty (their summary NaN).
func storeGaps(
	ctx context.Context,
	notes *[]string,
	what string,
	read func(context.Context, string, int64, int64) ([]int32, error),
	db string,
	w0, w1 time.Time,
) []int32 {
	out, err := read(ctx, db, w0.UnixMilli(), w1.UnixMilli())
	if err != nil {
		*notes = append(*notes, "server-side "+what+" figures unavailable: "+err.Error())
	}
	return out
}

// gaps runs a query of millisecond differences over [from, to) and returns
// them in microseconds; {stream} in it is the stream buffer (streamTable).
func gaps(ctx context.Context, db, query string, from, to int64) ([]int32, error) {
	conn, err := openRead(db)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	query = strings.ReplaceAll(query, "{stream}", streamTable(ctx, conn))
	rows, err := conn.QueryContext(ctx, rebind(db, query), from, to)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", redactDB(db), err)
	}
	defer rows.Close()
	var out []int32
	for rows.Next() {
		var ms int64
		if err := rows.Scan(&ms); err != nil {
			return nil, err
		}
		out = append(out, int32(ms*1000))
	}
	return out, rows.Err()
}

// sqliteInUse is what the SQLite database db holds, in bytes: its pages
// less its free ones (page_count − freelist_count, times page_size), in
// one statement, so one snapshot. Read through a read-only connection
// while the gateway runs, it counts the transactions committed to the WAL
// and not yet checkpointed into the file.
func sqliteInUse(ctx context.Context, db string) (int64, error) {
	conn, err := openRead(db)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	var n int64
	err = conn.QueryRowContext(ctx, `SELECT ((SELECT page_count FROM pragma_page_count()) - (SELECT freelist_count
		FROM pragma_freelist_count()))
		* (SELECT page_size FROM pragma_page_size())`).
		Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", db, err)
	}
	return n, nil
}

// sqliteFiles is the size of the SQLite database db's file and its -wal
// (none counts 0), in bytes. The -shm (the WAL's index, a few pages) is
// not counted.
func sqliteFiles(db string) (int64, error) {
	var sum int64
	for _, f := range []string{db, db + "-wal"} {
		fi, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) && f != db {
			continue
		}
		if err != nil {
			return 0, err
		}
		sum += fi.Size()
	}
	return sum, nil
}
