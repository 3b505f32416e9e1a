package roostinit

import (
	"slices"
	"testing"
)

// nsPIDs reads NSpid from a /proc status and from a pidfd's fdinfo alike, and gives nothing
// for what it cannot read: hostPIDs then falls back to the scan, or fails the start.
func TestNSpids(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int
	}{
		{"Name:\tsh\nNSpid:\t4242\t2\nNSpgid:\t4242\t2\n", []int{4242, 2}},
		{"pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nPid:\t4242\nNSpid:\t4242\t2\n", []int{4242, 2}},
		{"Pid:\t4242\nNSpid:\t4242\n", []int{4242}},
		{"Pid:\t-1\nNSpid:\t-1\n", []int{-1}},
		{"Pid:\t4242\n", nil},
		{"NSpid:\t42x\n", nil},
	} {
		if got := nsPIDs([]byte(c.in)); !slices.Equal(got, c.want) {
			t.Errorf("nsPIDs(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}
