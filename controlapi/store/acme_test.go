package store

import "testing"

func TestSwapSetting(t *testing.T) {
	eachStore(t, func(t *testing.T, s *Store) {
		if v, err := s.InitSetting(ctx(t), "lease", "a"); err != nil || v != "a" {
			t.Fatalf("init: %q, %v", v, err)
		}
		if v, _ := s.InitSetting(ctx(t), "lease", "b"); v != "a" {
			t.Fatalf("a second init replaced the value: %q", v)
		}
		if ok, err := s.SwapSetting(ctx(t), "lease", "b", "c"); err != nil || ok {
			t.Fatalf("swap from a value not held: %v, %v", ok, err)
		}
		if ok, err := s.SwapSetting(ctx(t), "lease", "a", "c"); err != nil || !ok {
			t.Fatalf("swap from the value held: %v, %v", ok, err)
		}
		if ok, _ := s.SwapSetting(ctx(t), "lease", "a", "d"); ok {
			t.Fatal("a second swap from the old value won too")
		}
		if v, _ := s.Setting(ctx(t), "lease"); v != "c" {
			t.Fatalf("value %q, want c", v)
		}
	})
}
