package store

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/pressly/goose/v3"

	"github.com/honestcancel/gateway/internal/pgtest"
)

func TestBatchExpandsInOrder(t *testing.T) {
	b := deltaBatch{ThreadID: "thr_a", FirstSeq: 7, LastSeq: 9, RunID: "run_a", MessageID: "msg_a", FirstPart: 3, Texts: `["Hel","lo, ","<wörld>"]`, TS: 42}
	got, err := b.deltas()
	if err != nil {
		t.Fatal(err)
	}
	want := []bufferedDelta{
		{"thr_a", 7, "run_a", "msg_a", 3, "Hel", 42},
		{"thr_a", 8, "run_a", "msg_a", 4, "lo, ", 42},
		{"thr_a", 9, "run_a", "msg_a", 5, "<wörld>", 42},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	enc, err := encodeTexts([]string{"Hel", "lo, ", "<wörld>"})
	if err != nil {
		t.Fatal(err)
	}
	b.Texts = enc
	if again, err := b.deltas(); err != nil || !reflect.DeepEqual(again, want) {
		t.Errorf("encoded then expanded: %+v %v", again, err)
	}
	// Deltas fanned out at different times keep each its own.
	first, offsets, err := encodeTimes([]int64{100, 100, 104})
	if err != nil || first != 100 || offsets != "[0,0,4]" {
		t.Fatalf("encodeTimes: %d %q %v", first, offsets, err)
	}
	if same, none, _ := encodeTimes([]int64{7, 7}); same != 7 || none != "" {
		t.Errorf("encodeTimes of equal times: %d %q, want 7 and no offsets", same, none)
	}
	b.TS, b.TSOffsets = first, offsets
	timed, err := b.deltas()
	if err != nil || timed[0].TS != 100 || timed[1].TS != 100 || timed[2].TS != 104 {
		t.Errorf("expanded with offsets: %+v %v", timed, err)
	}
	for _, bad := range []deltaBatch{
		{ThreadID: "thr_a", FirstSeq: 1, LastSeq: 2, Texts: `["a","b"]`, TSOffsets: `[0]`},
		{ThreadID: "thr_a", FirstSeq: 1, LastSeq: 2, Texts: `["one"]`},
		{ThreadID: "thr_a", FirstSeq: 1, LastSeq: 1, Texts: `not json`},
		{ThreadID: "thr_a", FirstSeq: 1, LastSeq: 1, Texts: `[1]`},
	} {
		if _, err := bad.deltas(); err == nil {
			t.Errorf("batch %+v expanded without an error", bad)
		}
	}
}

// A database at migration 5 holds one stream_deltas row per delta;
// migration 6 turns each into a batch of one with the same seq, part, text
// and ts, which replays, and its Down turns them back unchanged.
func TestStreamBatchesMigration(t *testing.T) {
	ctx := context.Background()
	driver, db, p := migrationProvider(t)
	if _, err := p.UpTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	type delta struct {
		Seq  int64
		Part int
		Text string
		TS   int64
	}
	old := []delta{{3, 0, "Hello", 100}, {4, 1, `, "quoted" \ wörld`, 101}, {6, 2, "", 102}}
	for _, d := range old {
		if _, err := db.Exec(rebind(driver, `INSERT INTO stream_deltas (thread_id, seq, run_id, message_id, part, text, ts) VALUES ('thr_m', ?, 'run_m', 'msg_m', ?, ?, ?)`),
			d.Seq, d.Part, d.Text, d.TS); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.UpTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(`SELECT ` + batchCols + ` FROM stream_batches ORDER BY first_seq`)
	if err != nil {
		t.Fatal(err)
	}
	var got []delta
	for rows.Next() {
		var b deltaBatch
		if err := rows.Scan(&b.ThreadID, &b.FirstSeq, &b.LastSeq, &b.RunID, &b.MessageID, &b.FirstPart, &b.Texts, &b.TS, &b.TSOffsets); err != nil {
			t.Fatal(err)
		}
		ds, err := b.deltas()
		if err != nil {
			t.Fatal(err)
		}
		if b.FirstSeq != b.LastSeq || b.ThreadID != "thr_m" || b.RunID != "run_m" || b.MessageID != "msg_m" {
			t.Errorf("migrated batch %+v, want one delta of thr_m/run_m/msg_m", b)
		}
		for _, d := range ds {
			got = append(got, delta{d.Seq, d.Part, d.Text, d.TS})
		}
	}
	rows.Close()
	if !reflect.DeepEqual(got, old) {
		t.Errorf("after migration 6: %+v\nwant %+v", got, old)
	}
	if _, err := p.DownTo(ctx, 5); err != nil {
		t.Fatal(err)
	}
	rows, err = db.Query(`SELECT seq, part, text, ts FROM stream_deltas ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got = nil
	for rows.Next() {
		var d delta
		if err := rows.Scan(&d.Seq, &d.Part, &d.Text, &d.TS); err != nil {
			t.Fatal(err)
		}
		got = append(got, d)
	}
	rows.Close()
	if !reflect.DeepEqual(got, old) {
		t.Errorf("after migration 6 down: %+v\nwant %+v", got, old)
	}
}

// rebind turns ? into $n for PostgreSQL.
func rebind(driver, q string) string {
	if driver != "pgx" {
		return q
	}
	return sqlx.Rebind(sqlx.DOLLAR, q)
}

// migrationProvider opens an empty test database (SQLite, or a fresh
// PostgreSQL schema) and a goose provider of the embedded migrations on
// it, for tests that migrate step by step; the database closes when the
// test ends. driver is the database/sql driver's name.
func migrationProvider(t *testing.T) (driver string, db *sql.DB, p *goose.Provider) {
	t.Helper()
	driver, dsn, dialect, dir := "sqlite3", filepath.Join(t.TempDir(), "old.db"), goose.DialectSQLite3, "migrations/sqlite"
	if pgtest.OnPostgres() {
		driver, dsn, dialect, dir = "pgx", pgtest.Schema(t), goose.DialectPostgres, "migrations/postgres"
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	sub, err := fs.Sub(migrations, dir)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = goose.NewProvider(dialect, db, sub); err != nil {
		t.Fatal(err)
	}
	return driver, db, p
}
