package store_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/store"
)

// Options.Synchronous reaches the writer connection's DSN: SQLite reports
// it back as PRAGMA synchronous, also after writes.
func TestSynchronousReachesTheWriter(t *testing.T) {
	want := map[string]int{"normal": 1, "full": 2}
	for setting, pragma := range map[string]int{
		store.SynchronousNormal: 1,
		store.SynchronousFull:   2,
		"FULL":                  2,
		"":                      want[store.DefaultSynchronous],
	} {
		t.Run("setting "+setting, func(t *testing.T) {
			st, err := store.Open(ctx, filepath.Join(t.TempDir(), "gw.db"), store.Options{Synchronous: setting})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if _, err := st.CreateThread(ctx, user, "t"); err != nil {
				t.Fatal(err)
			}
			got, err := st.Synchronous(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if got != pragma {
				t.Fatalf("PRAGMA synchronous = %d, want %d", got, pragma)
			}
		})
	}
}

// A setting SQLite has but the store does not offer (or a typo) is refused
// before anything is created, with the values to pass.
func TestSynchronousRefusesOtherValues(t *testing.T) {
	for _, setting := range []string{"extra", "off", "2", "fulll"} {
		dir := filepath.Join(t.TempDir(), "data")
		_, err := store.Open(ctx, filepath.Join(dir, "gw.db"), store.Options{Synchronous: setting})
		if err == nil {
			t.Fatalf("%q accepted", setting)
		}
		if msg := err.Error(); !strings.Contains(msg, `"`+setting+`"`) || !strings.Contains(msg, "use full") || !strings.Contains(msg, "or normal") {
			t.Fatalf("%q: error %q does not name the value and say what to pass", setting, msg)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("%q: the database folder was created (%v)", setting, err)
		}
	}
}
