package email

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/honestcancel/gateway/store"
)

// The provider's own connection takes the gateway's synchronous setting:
// its acceptances are acknowledgements too.
func TestOutboxSynchronous(t *testing.T) {
	def := map[string]int{store.SynchronousNormal: 1, store.SynchronousFull: 2}[store.DefaultSynchronous]
	for setting, want := range map[string]int{store.SynchronousNormal: 1, store.SynchronousFull: 2, "": def} {
		o, err := OpenOutbox(filepath.Join(t.TempDir(), "gw.db"), OutboxConfig{Synchronous: setting})
		if err != nil {
			t.Fatal(err)
		}
		var got int
		if err := o.db.Get(&got, `PRAGMA synchronous`); err != nil {
			t.Fatal(err)
		}
		o.Close()
		if got != want {
			t.Errorf("setting %q: PRAGMA synchronous = %d, want %d", setting, got, want)
		}
	}
	_, err := OpenOutbox(filepath.Join(t.TempDir(), "gw.db"), OutboxConfig{Synchronous: "extra"})
	if err == nil || !strings.Contains(err.Error(), "use full") || !strings.Contains(err.Error(), "or normal") {
		t.Fatalf("synchronous extra: %v, want a refusal saying what to pass", err)
	}
}
