package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

type hostKind int

const (
	kindNone hostKind = iota
	kindUnified
	kindV1
)

// detect tells a pure v2 host from a v1 (legacy or hybrid) one by the
// filesystem types mounted at root and root/memory.
func detect(root string) (hostKind, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return kindNone, err
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return kindUnified, nil
	}
	for _, c := range v1Controllers {
		if err := unix.Statfs(filepath.Join(root, c), &st); err != nil {
			return kindNone, fmt.Errorf("v1 controller %s: %w", c, err)
		}
		if st.Type != unix.CGROUP_SUPER_MAGIC {
			return kindNone, fmt.Errorf("v1 controller %s: %s is not a cgroup v1 mount", c, filepath.Join(root, c))
		}
	}
	return kindV1, nil
}

// selfPaths maps a v1 controller name (and "" for the v2 hierarchy) to the
// process's own cgroup path in it.
type selfPaths map[string]string

func readSelf(data []byte) (selfPaths, error) {
	if data == nil {
		var err error
		if data, err = readFile("/proc/self/cgroup"); err != nil {
			return nil, fmt.Errorf("read own cgroup: %w", err)
		}
	}
	return parseSelf(data)
}

// readOwn is parseOwn of this process's /proc/self/cgroup.
func readOwn() (selfPaths, error) {
	data, err := readFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read own cgroup: %w", err)
	}
	return parseOwn(data)
}

// parseSelf parses /proc/self/cgroup (parseOwn). When the process already
// sits in the agent leaf (a restarted agent placed itself there), its
// subtree is the leaf's parent.
func parseSelf(data []byte) (selfPaths, error) {
	out, err := parseOwn(data)
	for c, p := range out {
		if path.Base(p) == AgentLeaf {
			out[c] = path.Dir(p)
		}
	}
	return out, err
}

// parseOwn parses /proc/self/cgroup ("id:controllers:path" lines) into the
// process's own cgroup in each hierarchy, as they are.
func parseOwn(data []byte) (selfPaths, error) {
	out := selfPaths{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			return nil, fmt.Errorf("parse own cgroup: malformed line %q", line)
		}
		p := path.Clean(parts[2])
		if parts[1] == "" {
			out[""] = p
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = p
		}
	}
	return out, sc.Err()
}

// stripSubtree undoes a subtree already in the path: a restarted agent sits
// in <own>/<subtree>/agent, which parseSelf reads as <own>/<subtree>, and the
// manager adds <subtree> itself.
func stripSubtree(self selfPaths, subtree string) selfPaths {
	if subtree == "" {
		return self
	}
	out := selfPaths{}
	for c, p := range self {
		if path.Base(p) == subtree {
			p = path.Dir(p)
		}
		out[c] = p
	}
	return out
}
