package app

import (
	"strings"
	"testing"
)

func TestRedactedURLHidesCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"data/gateway.db": "data/gateway.db",
		"postgres://gw:s3cret@db:5432/gw?sslmode=disable":        "postgres://gw:xxxxx@db:5432/gw?sslmode=disable",
		"postgres://gw@db:5432/gw?password=s3cret":               "postgres://gw@db:5432/gw?password=xxxxx",
		"nats://s3cret@nats:4222":                                "nats://xxxxx@nats:4222",
		"nats://user:s3cret@nats:4222":                           "nats://user:xxxxx@nats:4222",
		"nats://nats:4222":                                       "nats://nats:4222",
		"user:s3cret@nats:4222":                                  "(not shown: it does not parse as a URL and may hold a password)",
		"postgres://gw:s3cret@db:5432/gw?sslpassword=s3cret&x=1": "postgres://gw:xxxxx@db:5432/gw?sslpassword=xxxxx&x=1",
	} {
		got := RedactedURL(in)
		if got != want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactedURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedactedURLOfNATSLists(t *testing.T) {
	for in, want := range map[string]string{
		"nats://u:s3cret@a:4222,nats://v:s3cret@b:4222": "nats://u:xxxxx@a:4222,nats://v:xxxxx@b:4222",
		"nats://a:4222, nats://s3cret@b:4222":           "nats://a:4222,nats://xxxxx@b:4222",
		"nats://u:s3,cr,et@a:4222":                      "(not shown: it does not parse as a list of URLs and may hold a password)",
		"nats://u:s3cret@a:4222":                        "nats://u:xxxxx@a:4222",
		"postgres://u:s3,cret@h:5432/db":                "postgres://u:xxxxx@h:5432/db",
		"data/a,b.db":                                   "data/a,b.db",
	} {
		if got := RedactedURL(in); got != want || strings.Contains(got, "s3") {
			t.Errorf("RedactedURL(%q) = %q, want %q", in, got, want)
		}
	}
}
