package store

import (
	"context"
	"net/url"
	"testing"

	"github.com/honestcancel/gateway/internal/pgtest"
)

func TestSessionLimitsAreAddedUnlessSet(t *testing.T) {
	got, err := withSessionLimits("postgres://u@h:5432/db?sslmode=disable&lock_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(got)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	if q.Get("lock_timeout") != "1s" || q.Get("idle_in_transaction_session_timeout") != "5s" || q.Get("sslmode") != "disable" {
		t.Fatalf("withSessionLimits gave %s: want the URL's own lock_timeout kept, the idle timeout added, the rest untouched", got)
	}
	if _, err := withSessionLimits("postgres://%zz"); err == nil {
		t.Fatal("a malformed URL was accepted")
	}
}

// The writer's session on PostgreSQL really runs with the limits.
func TestPostgresSessionHasTheLimits(t *testing.T) {
	st, err := Open(context.Background(), pgtest.Schema(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for name, want := range map[string]string{"lock_timeout": "2s", "idle_in_transaction_session_timeout": "5s"} {
		var got string
		if err := st.writer.Get(&got, `SHOW `+name); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %q on the writer's session, want %q", name, got, want)
		}
	}
}
