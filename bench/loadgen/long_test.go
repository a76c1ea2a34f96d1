package loadgen

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/model"
	"github.com/honestcancel/gateway/model/demo"
)

func TestEdgeSpans(t *testing.T) {
	for _, c := range []struct {
		n, k        int
		first, last span
		fl, ll      string
	}{
		{300, 10, span{0, 10}, span{290, 300}, "exchanges 1–10", "exchanges 291–300"},
		{15, 10, span{0, 10}, span{5, 15}, "exchanges 1–10", "exchanges 6–15"}, // overlapping
		{4, 10, span{0, 4}, span{0, 4}, "exchanges 1–4", "exchanges 1–4"},
		{1, 10, span{0, 1}, span{0, 1}, "exchange 1", "exchange 1"},
		{0, 10, span{0, 0}, span{0, 0}, "no exchange", "no exchange"},
	} {
		f, l := edgeSpans(c.n, c.k)
		if f != c.first || l != c.last || f.label() != c.fl || l.label() != c.ll {
			t.Errorf("edgeSpans(%d, %d) = %v %q, %v %q", c.n, c.k, f, f.label(), l, l.label())
		}
	}
}

func TestPerExchange(t *testing.T) {
	got := perExchange([]int64{100, 150, 150, 400})
	if len(got) != 3 || got[0] != 50 || got[1] != 0 || got[2] != 250 {
		t.Errorf("perExchange = %v", got)
	}
	if perExchange([]int64{7}) != nil || perExchange(nil) != nil {
		t.Error("one reading made an exchange")
	}
}

func TestSpanMeanMedian(t *testing.T) {
	per := []int64{4, 1, 3, 2, 100, 6}
	if got := spanMean(per, span{0, 4}); got != 2.5 {
		t.Errorf("mean of 4 1 3 2 = %v", got)
	}
	if got := spanMedian(per, span{0, 4}); got != 2.5 {
		t.Errorf("median of 4 1 3 2 = %v", got)
	}
	if got := spanMedian(per, span{2, 5}); got != 3 {
		t.Errorf("median of 3 2 100 = %v", got)
	}
	if got := spanMean(per, span{2, 5}); got != 35 {
		t.Errorf("mean of 3 2 100 = %v", got)
	}
	if per[0] != 4 || per[1] != 1 {
		t.Errorf("the median sorted its input: %v", per)
	}
	for _, s := range []span{{0, 7}, {3, 3}, {-1, 2}} {
		if !math.IsNaN(spanMean(per, s)) || !math.IsNaN(spanMedian(per, s)) {
			t.Errorf("span %v of %d values has a figure", s, len(per))
		}
	}
	if !math.IsNaN(spanMean(nil, span{0, 10})) {
		t.Error("no readings have a mean")
	}
}

func TestSpanDist(t *testing.T) {
	per := []int64{9000, 1000, 3000, 2000, -5}
	d := spanDist(per, span{0, 4})
	if d.N != 4 || d.P50 != 2 || d.P99 != 9 || per[0] != 9000 {
		t.Errorf("spanDist = %+v (input %v)", d, per)
	}
	if d := spanDist(per, span{4, 5}); d.N != 1 || d.P50 != 0 {
		t.Errorf("a negative sample: %+v", d)
	}
	if d := spanDist(per, span{3, 9}); d.N != 0 || !math.IsNaN(d.P50) {
		t.Errorf("uncovered span: %+v", d)
	}
}

func TestRatio(t *testing.T) {
	if got := ratio(33, 30); math.Abs(got-1.1) > 1e-12 {
		t.Errorf("ratio(33, 30) = %v", got)
	}
	for _, c := range [][2]float64{{1, 0}, {1, -2}, {nan, 1}, {1, nan}} {
		if !math.IsNaN(ratio(c[0], c[1])) {
			t.Errorf("ratio(%v, %v) is a figure", c[0], c[1])
		}
	}
}

// The demo model answers shortMessage in at most 10 words, however long
// the conversation before it.
func TestShortMessageHasAShortReply(t *testing.T) {
	var history []model.Message
	for i := range 50 {
		history = append(history, model.Message{Role: model.RoleUser, Content: shortMessage(i)})
		stream, err := demo.New(0).Stream(context.Background(), model.Request{Messages: history})
		if err != nil {
			t.Fatal(err)
		}
		var text strings.Builder
		for {
			c, err := stream.Next(context.Background())
			if errors.Is(err, model.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Call != nil || c.Card {
				t.Fatalf("exchange %d: a tool call or card: %+v", i+1, c)
			}
			text.WriteString(c.Text)
		}
		stream.Close()
		if w := len(strings.Fields(text.String())); w == 0 || w > 10 {
			t.Fatalf("exchange %d: %d words: %q", i+1, w, text.String())
		}
		history = append(history, model.Message{Role: model.RoleAssistant, Content: text.String()})
	}
}

func TestSQLiteFiles(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "x.db")
	if _, err := sqliteFiles(db); err == nil {
		t.Error("a missing database has a size")
	}
	if err := os.WriteFile(db, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := sqliteFiles(db); err != nil || got != 4096 {
		t.Errorf("without -wal: %d, %v", got, err)
	}
	if err := os.WriteFile(db+"-wal", make([]byte, 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(db+"-shm", make([]byte, 32768), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := sqliteFiles(db); err != nil || got != 5096 {
		t.Errorf("with -wal and -shm: %d, %v", got, err)
	}
}

func TestSQLiteInUse(t *testing.T) {
	db := filepath.Join(t.TempDir(), "x.db")
	w, err := sql.Open("sqlite3", "file:"+db+"?_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	if _, err := w.ExecContext(ctx, `CREATE TABLE t (v BLOB)`); err != nil {
		t.Fatal(err)
	}
	before, err := sqliteInUse(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	// 64 KiB in the WAL, not yet in the file, and held open by w: the
	// reader counts it.
	if _, err := w.ExecContext(ctx, `INSERT INTO t VALUES (zeroblob(65536))`); err != nil {
		t.Fatal(err)
	}
	after, err := sqliteInUse(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 65536 || d > 65536+4*4096 {
		t.Errorf("64 KiB inserted: in use %d → %d", before, after)
	}
	// Deleted, its pages are free: no longer in use.
	if _, err := w.ExecContext(ctx, `DELETE FROM t`); err != nil {
		t.Fatal(err)
	}
	if got, err := sqliteInUse(ctx, db); err != nil || got != before {
		t.Errorf("after the delete: %d (before the insert %d), %v", got, before, err)
	}
}
