package auth

// Known devices. A successful sign-in gives the browser a device cookie
// holding a proof, for that account, that it signed in there: a random
// device id, when the proof was issued, and an HMAC of both keyed by the
// account's password hash. The server keeps nothing: any instance can
// check a proof against the account it names, a restart forgets nothing,
// and a new password (`gateway user passwd`) or deleting the account
// makes every proof of it worthless. A proof opens nothing by itself: it
// only makes its browser a known client of the brake (limiter.go), which
// a stranger guessing from other addresses cannot slow down or lock out.

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The names of the device cookie: like the session cookie's, with the
// __Host- prefix when it is Secure.
const (
	DeviceCookie       = "gateway_device"
	SecureDeviceCookie = "__Host-" + DeviceCookie
)

// DeviceTTL is how long a device stays known after its last successful
// sign-in (each sign-in renews it).
const DeviceTTL = 180 * 24 * time.Hour

// maxDeviceProofs bounds the accounts one browser is a known device of
// (the most recent sign-ins win) and so the work a cookie can ask for.
const maxDeviceProofs = 4

// deviceProof is one entry of the cookie: "<id>.<issued unix s>.<mac>".
type deviceProof struct {
	raw    string
	id     string
	issued int64
	mac    []byte
}

// deviceProofs reads the request's device cookie: the __Host- one,
// or over plain http the plain one. Malformed entries are skipped.
func (a *Authenticator) deviceProofs(r *http.Request) []deviceProof {
	c, err := r.Cookie(SecureDeviceCookie)
	if (err != nil || c.Value == "") && !a.secure(r) {
		c, err = r.Cookie(DeviceCookie)
	}
	if err != nil || len(c.Value) > maxDeviceProofs*128 {
		return nil
	}
	var out []deviceProof
	entries := strings.Split(c.Value, "~")
	for _, raw := range entries[:min(len(entries), maxDeviceProofs)] {
		id, rest, ok1 := strings.Cut(raw, ".")
		issued, mac, ok2 := strings.Cut(rest, ".")
		secs, err := strconv.ParseInt(issued, 10, 64)
		sum, err2 := base64.RawURLEncoding.DecodeString(mac)
		if !ok1 || !ok2 || id == "" || len(id) > 32 || err != nil || err2 != nil || len(sum) != sha256.Size {
			continue
		}
		out = append(out, deviceProof{raw: raw, id: id, issued: secs, mac: sum})
	}
	return out
}

// deviceMAC is a proof's HMAC: the device id and issue time, for userID,
// keyed by the account's password hash.
func deviceMAC(passwordHash, userID, id string, issued int64) []byte {
	m := hmac.New(sha256.New, []byte(passwordHash))
	m.Write([]byte("gateway device v1\x00" + userID + "\x00" + id + "\x00" + strconv.FormatInt(issued, 10)))
	return m.Sum(nil)
}

// validFor reports whether p is a live proof the account (userID, with
// passwordHash, which must not be empty) issued.
func (p deviceProof) validFor(userID, passwordHash string, now time.Time) bool {
	issued := time.Unix(p.issued, 0)
	return passwordHash != "" && !issued.After(now.Add(time.Minute)) && now.Sub(issued) < DeviceTTL &&
		hmac.Equal(p.mac, deviceMAC(passwordHash, userID, p.id, p.issued))
}

// knownDevice is the id of the first of proofs the account issued, or "".
func knownDevice(proofs []deviceProof, userID, passwordHash string, now time.Time) string {
	for _, p := range proofs {
		if p.validFor(userID, passwordHash, now) {
			return p.id
		}
	}
	return ""
}

// rememberDevice sets the device cookie after a successful sign-in: a
// fresh proof for the account (keeping the device's id when it was
// known already) first, then the proofs it held for other accounts.
func (a *Authenticator) rememberDevice(w http.ResponseWriter, r *http.Request, proofs []deviceProof,
	userID, passwordHash, knownID string, now time.Time) {
	id := knownID
	if id == "" {
		id = rand.Text()
	}
	issued := now.Unix()
	entries := []string{id + "." + strconv.FormatInt(issued, 10) + "." +
		base64.RawURLEncoding.EncodeToString(deviceMAC(passwordHash, userID, id, issued))}
	for _, p := range proofs {
		if len(entries) < maxDeviceProofs && !p.validFor(userID, passwordHash, now) {
			entries = append(entries, p.raw)
		}
	}
	secure := a.secure(r)
	name := DeviceCookie
	if secure {
		name = SecureDeviceCookie
	}
	http.SetCookie(w, &http.Cookie{Name: name, Value: strings.Join(entries, "~"), Path: "/",
		Expires: now.Add(DeviceTTL), MaxAge: int(DeviceTTL / time.Second), HttpOnly: true,
		SameSite: http.SameSiteLaxMode, Secure: secure})
}
