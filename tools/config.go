package tools

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// MCPServersField is the tools config file's (-tools-config) array of MCP
// servers, read by package mcp; the file's "tools" array is package
// webhook's, which checks the whole document.
const MCPServersField = "mcp_servers"

// EnvVarName is what an environment variable's name may be: letters,
// digits and "_", not starting with a digit.
var EnvVarName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ExpandEnvRefs replaces every ${NAME} in v with the environment variable
// NAME, which must be set and non-empty, so a tools config file can name
// its secrets without holding them. A "$" not followed by "{" is kept.
// Errors never hold v.
func ExpandEnvRefs(v string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(v, "${")
		if i < 0 {
			b.WriteString(v)
			return b.String(), nil
		}
		b.WriteString(v[:i])
		rest := v[i+2:]
		j := strings.IndexByte(rest, '}')
		if j < 0 {
			return "", errors.New(`a "${" has no closing "}"`)
		}
		name := rest[:j]
		if !EnvVarName.MatchString(name) {
			return "", errors.New("a ${...} reference does not name a variable (letters, digits and _, not starting with a digit)")
		}
		val, ok := os.LookupEnv(name)
		if !ok || val == "" {
			return "", fmt.Errorf("environment variable %s is not set (or is empty)", name)
		}
		b.WriteString(val)
		v = rest[j+1:]
	}
}

// ActionKey is the business idempotency key of the consequential tool
// name called with the normalised arguments norm in scope (see
// Committer.Prepare): "<name>:<scope>:<16 hex of sha256(norm)>:commit".
func ActionKey(name, scope string, norm json.RawMessage) string {
	sum := sha256.Sum256(norm)
	return name + ":" + scope + ":" + hex.EncodeToString(sum[:])[:16] + ":commit"
}
