package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// secretSetting resolves one secret setting (what names it in errors, "the
// OpenAI API key") that may come from the environment (envName) or from a file named by a -…-file flag (fileFlag,
// whose value is path): never from a flag holding the secret itself, which
// every user of the machine could read in the process list. It answers ""
// when neither is set. The secret's value never appears in an error.
//
// The file's content is trimmed of surrounding white space (a trailing
// newline is what editors and `echo` leave); an empty or unreadable file is
// an error that names the flag and the file.
func secretSetting(what, envName, fileFlag, path string) (string, error) {
	fromEnv := os.Getenv(envName)
	if path == "" {
		return strings.TrimSpace(fromEnv), nil
	}
	if fromEnv != "" {
		return "", fmt.Errorf("%s is set twice: use %s or -%s (%s_FILE), not both", what, envName, fileFlag, envName)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", fmt.Errorf("-%s: cannot read %s (%s): %v", fileFlag, path, what, err)
	}
	secret := strings.TrimSpace(string(data))
	if secret == "" {
		return "", fmt.Errorf("-%s: %s is empty: put %s in it", fileFlag, path, what)
	}
	return secret, nil
}
