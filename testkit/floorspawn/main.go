// Command floorspawn is a benchmark's floor, not part of the product: the
// least a supervisor exec'd from cold can do to start cells the way the
// agent starts them. BenchmarkWholeProcess8 (cmd/cellvisor) execs it to
// tell what any supervisor of this design pays on a host (being a process
// exec'd from cold, holding the cells' ports, limits enforced before a
// cell's first instruction) from what the agent adds with its own work
// (configuration, releases verified, recovery, records, logs, probes).
//
// It reads a spec (JSON, the file named by its one argument) and starts
// its cells as a minimal spawner of the agent's design would: one goroutine
// creates each cell's cgroups and writes their limits, in turn, while the
// main one starts each cell's command as soon as its groups are there (the
// agent's start pass uses two spawners since round 13, a gain this floor
// does not take: docs/performance.md), through the agent's own join
// helper (cgexec.Join) for a cell in v1 groups: built into floorspawn when it
// is linked with cgexec.LDFlags, as the agent is. A cell's listen addresses
// are bound here and handed to its master as the agent hands them (fds 3
// on, named by the NGINX variable). It verifies nothing, logs nothing and
// keeps no state. On SIGTERM or SIGINT it kills
// every cell's process group, reaps its children and exits 0; the groups
// are left for its caller to remove.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	"cellvisor/cgexec"
	"cellvisor/internal/sysfile"
)

// spec is what floorspawn starts.
type spec struct {
	Cells []cell `json:"cells"`
}

type cell struct {
	// Groups are created in turn (their parents must exist), each with
	// its limit files written in order, before Argv starts.
	Groups []group `json:"groups"`
	// Join are v1 tasks files Argv joins before its exec (cgexec.Join).
	Join   []string  `json:"join"`
	Argv   []string  `json:"argv"`
	Listen []address `json:"listen"` // none: the master binds its own ports
}

type group struct {
	Dir    string      `json:"dir"`
	Limits [][2]string `json:"limits"` // file name, value
}

type address struct {
	IP   string `json:"ip"`
	Port int    `json:"port"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "floorspawn:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) != 2 {
		return errors.New("usage: floorspawn SPEC.json")
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		return err
	}
	var s spec
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var started []*exec.Cmd
	defer func() {
		for _, c := range started {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
	}()
	made := make(chan error, len(s.Cells))
	go func() {
		for _, c := range s.Cells {
			err := create(c)
			made <- err
			if err != nil {
				return
			}
		}
	}()
	for _, c := range s.Cells {
		if err := <-made; err != nil {
			return err
		}
		cmd, err := start(c)
		if err != nil {
			return err
		}
		started = append(started, cmd)
	}
	<-stop
	return nil
}

// create makes c's groups and writes their limits, as the agent writes
// them (sysfile).
func create(c cell) error {
	for _, g := range c.Groups {
		if err := os.Mkdir(g.Dir, 0o755); err != nil {
			return err
		}
		for _, l := range g.Limits {
			if err := sysfile.WriteFile(filepath.Join(g.Dir, l[0]), []byte(l[1]), 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// start starts c's command, with its listeners.
func start(c cell) (*exec.Cmd, error) {
	if len(c.Argv) == 0 {
		return nil, errors.New("a cell without a command")
	}
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	if len(c.Join) > 0 {
		cmd.Path, cmd.Args = cgexec.Join(nil, c.Join, c.Argv)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if len(c.Listen) > 0 {
		env := "NGINX="
		for i, a := range c.Listen {
			f, err := bind(a)
			if err != nil {
				return nil, err
			}
			defer f.Close() // the master has its copy once started
			cmd.ExtraFiles = append(cmd.ExtraFiles, f)
			env += strconv.Itoa(3+i) + ";"
		}
		cmd.Env = append(os.Environ(), env)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// bind binds a as nginx binds a listener (SO_REUSEADDR, backlog 511,
// non-blocking), as the agent's supervisor does. It is not imported from
// there: floorspawn links nothing but the standard library and cgexec (which
// links nothing else), so that its own start is an empty Go program's.
func bind(a address) (*os.File, error) {
	ip, err := netip.ParseAddr(a.IP)
	if err != nil {
		return nil, err
	}
	ip = ip.Unmap()
	family, sa := syscall.AF_INET6, syscall.Sockaddr(&syscall.SockaddrInet6{Port: a.Port, Addr: ip.As16()})
	if ip.Is4() {
		family, sa = syscall.AF_INET, &syscall.SockaddrInet4{Port: a.Port, Addr: ip.As4()}
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	err = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err == nil {
		err = syscall.Bind(fd, sa)
	}
	if err == nil {
		err = syscall.Listen(fd, 511)
	}
	if err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("listen on %s port %d: %w", a.IP, a.Port, err)
	}
	return os.NewFile(uintptr(fd), "listener"), nil
}
