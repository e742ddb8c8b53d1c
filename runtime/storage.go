package runtime

// CacheTarget is the size nginx's cache manager keeps a cell's cache to
// (proxy_cache_path max_size) for a budget of limits.cache: three quarters
// of it. The rest is headroom for what the cell writes between two looks
// of the agent's watch, which wakes the manager once the cache is over the
// target (supervisor, issue 39).
func CacheTarget(budget int64) int64 { return budget / 4 * 3 }
