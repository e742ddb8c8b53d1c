package main

import "testing"

func TestLookupUser(t *testing.T) {
	for _, name := range []string{"root", "0"} {
		uid, gid, err := lookupUser(name)
		if err != nil || uid != 0 || gid != 0 {
			t.Errorf("lookupUser(%q) = %d, %d, %v; want 0, 0", name, uid, gid, err)
		}
	}
	if _, _, err := lookupUser("no-such-user-cellvisor-test"); err == nil {
		t.Error("lookupUser of an unknown user: want an error")
	}
}
