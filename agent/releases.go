package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"go.uber.org/zap"

	"cellvisor/config"
	"cellvisor/internal/atomicfile"
	"cellvisor/internal/sysfile"
	"cellvisor/runtime"
)

// verifyReleases re-checks every assigned slot's active release before any
// cell starts: a damaged one is replaced by the newest intact older one, and
// a slot with none stays degraded (unless rebuilt: a standalone agent builds
// it anew from its domains directory). This is what lets an agent restarted
// with its control plane unreachable serve from disk, and only what is
// whole. It returns each slot's intact active release, and the lowest
// sequence the active sequence must go back to (-1: none) so that what a
// slot lost is fetched again: the one a slot was rolled back to, or the one
// before a damaged release that had nothing to roll back to. An enrolled
// agent has no domains directory to rebuild that one from: the slot's
// release is withdrawn, so that no cell starts on it, and the slot waits
// for it to be fetched and activated again.
func verifyReleases(topo runtime.Topology, assign runtime.Assignments, rebuilt bool, log *zap.Logger) (active map[string]runtime.ReleaseMeta, rewind int64) {
	active, rewind = map[string]runtime.ReleaseMeta{}, -1
	back := func(seq int64) {
		if rewind < 0 || seq < rewind {
			rewind = seq
		}
	}
	for _, s := range topo.Slots {
		if assign[s.Name] == "" {
			continue
		}
		m, rolledBack, err := runtime.VerifyCurrent(s)
		switch {
		case errors.Is(err, runtime.ErrNoRelease):
			continue
		case err != nil && rebuilt:
			log.Error("no intact release; building it anew from domains_dir", zap.String("cell", s.Name), zap.Error(err))
			continue
		case err != nil:
			seq, _ := runtime.CurrentSequence(s)
			if werr := runtime.Withdraw(s); werr != nil {
				log.Error("no intact release, and it cannot be withdrawn: the cell starts on it", zap.String("cell", s.Name), zap.Error(err), zap.NamedError("withdraw", werr))
				continue
			}
			log.Error("no intact release; withdrawn, the cell waits for it to be fetched again", zap.String("cell", s.Name), zap.Int64("sequence", seq), zap.Error(err))
			back(max(seq-1, 0)) // 0 (fetch the newest) where the sequence is unknown
			continue
		case rolledBack:
			log.Warn("active release was damaged; rolled back", zap.String("cell", s.Name), zap.Int64("sequence", m.Sequence))
			back(m.Sequence)
		}
		active[s.Name] = m
	}
	return active, rewind
}

// buildStandalone compiles the local domains directory into a release for
// every assigned slot and switches to it unless the slot's intact active
// release (active, from verifyReleases) does the same already: on a
// restart with the same domains, nothing is rendered but what tells that,
// and nothing at all where the slot's inputs record says the active
// release was made of the very same inputs (runtime.ReleaseInputs). A
// damaged release that no older one could replace is replaced by a new
// one. A bad domains directory refuses to start, naming the file.
func buildStandalone(cfg config.Agent, topo runtime.Topology, assign runtime.Assignments, active map[string]runtime.ReleaseMeta, log *zap.Logger) error {
	domains, err := runtime.LoadDomainsDir(cfg.DomainsDir)
	if err != nil {
		return fmt.Errorf("domains_dir %s: %w", cfg.DomainsDir, err)
	}
	pools, err := runtime.CompilePools(domains)
	if err != nil {
		return err
	}
	for _, s := range topo.Slots {
		pool := assign[s.Name]
		if pool == "" {
			continue
		}
		var seq int64 = 1
		cur, intact := active[s.Name]
		damaged := false
		if intact {
			seq = cur.Sequence + 1
		} else if last, ok := runtime.CurrentSequence(s); ok {
			// A release that failed verification is still active: its
			// sequence is the one to go past.
			damaged, seq = true, last+1
		}
		p := RenderParams(cfg, s, pool, seq)
		in, err := runtime.ReleaseInputs(p, pools[pool])
		if err != nil {
			return err
		}
		var recorded inputsRecord // what the slot's record says, where it may tell
		if intact && cur.Pool == pool {
			if recorded = readInputs(s); in != "" && recorded == (inputsRecord{Release: cur.ID, Inputs: in}) {
				continue
			}
			d, err := releaseDigest(p, pools[pool])
			if err != nil {
				return err
			}
			if d == cur.Digest {
				writeInputs(s, inputsRecord{Release: cur.ID, Inputs: in}, recorded, log)
				continue
			}
		}
		r, err := runtime.BuildRelease(p, pools[pool])
		if err != nil {
			return err
		}
		activate := runtime.Activate
		if damaged {
			activate = runtime.Replace
		}
		meta, changed, err := activate(s, r)
		if err != nil {
			return err
		}
		if changed {
			log.Info("release activated", zap.String("cell", s.Name), zap.String("pool", pool), zap.Int64("sequence", meta.Sequence))
		}
		writeInputs(s, inputsRecord{Release: meta.ID, Inputs: in}, recorded, log)
	}
	return nil
}

// releaseDigest is runtime.ReleaseDigest (a variable for tests, which
// count the renders a start does).
var releaseDigest = runtime.ReleaseDigest

// inputsFile, in a slot's runtime directory, records which release a
// standalone start found made of which inputs (runtime.ReleaseInputs):
// the next start with the same inputs and that release still active keeps
// it without rendering its nginx.conf for the digest, about 0.1 ms of CPU
// a slot and the template's parse (docs/performance.md, round 12). It is
// written only when it changes, and a missing or damaged one only costs
// that render.
const inputsFile = "standalone-inputs.json"

type inputsRecord struct {
	Release string `json:"release"`
	Inputs  string `json:"inputs"`
}

// readInputs reads the slot's inputs record; a missing or damaged one
// reads as none.
func readInputs(s runtime.Slot) inputsRecord {
	var rec inputsRecord
	if b, err := sysfile.ReadFile(filepath.Join(s.RuntimeDir(), inputsFile), 4096); err == nil {
		_ = json.Unmarshal(b, &rec)
	}
	return rec
}

// writeInputs records rec for the slot unless it is what the record held
// already (recorded, as read).
func writeInputs(s runtime.Slot, rec, recorded inputsRecord, log *zap.Logger) {
	if rec.Inputs == "" || rec == recorded {
		return
	}
	b, err := json.Marshal(rec)
	if err == nil {
		err = atomicfile.WriteFile(filepath.Join(s.RuntimeDir(), inputsFile), append(b, '\n'), 0o600)
	}
	if err != nil {
		log.Warn("record the release's inputs: the next start renders its digest again", zap.String("cell", s.Name), zap.Error(err))
	}
}

// workerNofile is a cell worker's open file limit: two descriptors per
// connection (a client's and an origin's), within the hard limit the agent
// itself has (its unit's LimitNOFILE), which the cells inherit; 0 where it
// cannot be read (none rendered).
func workerNofile(conns int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return int(min(uint64(2*conns+64), r.Max))
}

// RenderParams are the render inputs for a slot from the configuration.
func RenderParams(cfg config.Agent, s runtime.Slot, pool string, seq int64) runtime.RenderParams {
	p := runtime.RenderParams{
		Slot:                  s,
		Pool:                  pool,
		Sequence:              seq,
		Address:               cfg.Ports.Address,
		Modules:               cfg.OpenResty.Modules,
		WorkerConnections:     cfg.OpenResty.WorkerConnections,
		WorkerShutdownTimeout: int(cfg.OpenResty.WorkerShutdownTimeout.D().Seconds()),
		WorkerNofile:          workerNofile(cfg.OpenResty.WorkerConnections),
		ClientHeaderTimeout:   int(cfg.OpenResty.ClientHeaderTimeout.D().Seconds()),
		ClientBodyTimeout:     int(cfg.OpenResty.ClientBodyTimeout.D().Seconds()),
		SendTimeout:           int(cfg.OpenResty.SendTimeout.D().Seconds()),
		ExposeCell:            cfg.OpenResty.ExposeCell,
		CacheMaxBytes:         runtime.CacheTarget(int64(cfg.Limits.Cache)),
		CacheBudgetBytes:      int64(cfg.Limits.Cache),
		RequestMaxBytes:       int64(cfg.Limits.RequestTmp),
		FrontDoorFile:         FrontDoorFile(cfg.StateDir),
		Resolvers:             cfg.OpenResty.Resolvers,
	}
	if len(p.Resolvers) == 0 {
		p.Resolvers = hostResolvers()
	}
	if f := cfg.OpenResty.OriginCAFile; f != "" {
		if _, err := os.Stat(f); err == nil {
			p.OriginCAFile = f
		}
	}
	if os.Geteuid() == 0 {
		// Cells run as the agent's user; as root that needs saying, or
		// nginx would switch its workers to nobody.
		p.User = cellUser()
	}
	return p
}

// cellUser is nginx's "user" line for the agent's own user and group, ""
// when they cannot be read. Looked up once: each lookup reads /etc/passwd
// and /etc/group (the static binary's own lookup), and a start renders
// every slot's release.
var cellUser = sync.OnceValue(func() string {
	u, err := user.Current()
	if err != nil {
		return ""
	}
	return u.Username + " " + groupName(u)
})

func groupName(u *user.User) string {
	if g, err := user.LookupGroupId(u.Gid); err == nil {
		return g.Name
	}
	return strings.TrimSpace(u.Gid)
}

// resolvConf is the host's resolver configuration (a variable for tests).
var resolvConf = "/etc/resolv.conf"

// hostResolvers are the nameservers of the host's /etc/resolv.conf (at
// most 8), or none where it names none.
func hostResolvers() []string {
	data, err := sysfile.ReadFile(resolvConf, 64<<10)
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" && net.ParseIP(f[1]) != nil && len(out) < 8 {
			ip := f[1]
			if strings.Contains(ip, ":") {
				ip = "[" + ip + "]:53"
			}
			out = append(out, ip)
		}
	}
	return out
}
