package auth

// SetCompare replaces a's bcrypt comparison, so that a test can count the
// password checks that really run and hold them until it has seen what
// every other attempt was answered. Call it before a is used.
func SetCompare(a *Authenticator, compare func(hash, password []byte) error) { a.compare = compare }

// CachedCredentials is how many credentials a's cache holds.
func CachedCredentials(a *Authenticator) int { return a.checked.len() }
