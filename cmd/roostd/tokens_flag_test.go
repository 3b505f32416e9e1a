package main

import (
	"strings"
	"testing"
)

// --machine-tokens-per-day takes the counts an operator types (10M, 500k); a binary unit is
// refused naming the flag and why, and the flag left out keeps the ledger's ceiling.
func TestMachineTokensFlag(t *testing.T) {
	for arg, want := range map[string]int64{"10M": 10e6, "500k": 500e3, "2000000": 2e6, "1G": 1e9, "0": 0} {
		o, err := parseFlags([]string{"--machine-tokens-per-day", arg})
		if err != nil {
			t.Errorf("--machine-tokens-per-day %s: %v", arg, err)
			continue
		}
		if !o.machineTokensSet || o.machineTokens != want {
			t.Errorf("--machine-tokens-per-day %s: %d (set %v), want %d", arg, o.machineTokens, o.machineTokensSet, want)
		}
	}
	for arg, says := range map[string]string{"10Mi": "Mi is a power of 1024", "-5": "expected a token count", "10m": "expected a token count", "": "expected a token count"} {
		_, err := parseFlags([]string{"--machine-tokens-per-day", arg})
		if err == nil || !strings.Contains(err.Error(), "--machine-tokens-per-day") || !strings.Contains(err.Error(), says) {
			t.Errorf("--machine-tokens-per-day %q: %v, want an error naming the flag and saying %q", arg, err, says)
		}
	}
	if o, err := parseFlags(nil); err != nil {
		t.Errorf("no flag: %v", err)
	} else if o.machineTokensSet {
		t.Error("no flag: the ceiling is taken as set")
	}
}
