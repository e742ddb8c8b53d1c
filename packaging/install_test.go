package packaging

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cellvisor/testkit/testutil"
)

// TestDebInstallUpgradePurge installs the .debs on this host with dpkg,
// checks the users, files, owners and modes and that the binaries run,
// upgrades to a newer build (an edited agent.yaml and the state survive),
// then purges and checks that only what policy keeps is left. A failing
// systemctl stands first on PATH: the maintainer scripts must cope with
// systemd not running (as here) or failing, and must never enable or start
// anything. The packages never stay installed: a cleanup purges them.
func TestDebInstallUpgradePurge(t *testing.T) {
	if testing.Short() {
		t.Skip("installs packages on this host: not in -short")
	}
	testutil.RequireRoot(t)
	requireTool(t, "dpkg", "to install .deb packages")
	requireTool(t, "dpkg-deb", "to build the .deb packages' checks")
	for _, p := range Packages {
		if st := dpkgStatus(t, p); st != "" {
			t.Skipf("%s is already installed on this host (%s): not touching it", p, st)
		}
		if _, err := os.Lstat("/usr/bin/" + p); err == nil {
			t.Skipf("/usr/bin/%s exists outside a package: not overwriting it", p)
		}
	}
	if dpkgStatus(t, "openresty") == "" && (dpkgStatus(t, "libnginx-mod-http-lua") == "" || dpkgStatus(t, "lua-cjson") == "") {
		t.Skip("needs openresty, or libnginx-mod-http-lua and lua-cjson, installed (the package's dependencies; make deps)")
	}
	// What existed before the test is left as it was; what the test made
	// (users the policy keeps, the control API's kept data) it removes.
	_, agentUserBefore := user.Lookup("cellvisor")
	_, controlUserBefore := user.Lookup("cellvisor-control")
	_, controlDataBefore := os.Lstat("/var/lib/cellvisor-control")

	older := packagesFor(t, "0.0.1~test+git1.gabc")
	newer := packagesFor(t, "0.0.1~test+git2.gdef")
	t.Cleanup(func() {
		if controlDataBefore != nil {
			os.RemoveAll("/var/lib/cellvisor-control")
		}
		for name, before := range map[string]error{"cellvisor": agentUserBefore, "cellvisor-control": controlUserBefore} {
			if before != nil {
				removeUser(t, name)
			}
		}
	})

	t.Run("systemd not running", func(t *testing.T) {
		if _, err := os.Stat("/run/systemd/system"); err == nil {
			t.Skip("systemd runs on this host")
		}
		debLifecycle(t, older, newer, false)
	})
	t.Run("systemctl failing", func(t *testing.T) {
		// dpkg runs in a mount namespace of its own where /run/systemd/system
		// exists: the scripts believe systemd runs, and every systemctl fails.
		if _, err := exec.LookPath("unshare"); err != nil {
			t.Skipf("needs unshare (util-linux) for a mount namespace: %v", err)
		}
		debLifecycle(t, older, newer, true)
	})
}

// debLifecycle installs older, upgrades to newer and purges, with a
// systemctl first on PATH that records its arguments and fails; with
// systemdUp, dpkg sees /run/systemd/system (in a mount namespace of its own).
func debLifecycle(t *testing.T, older, newer map[string]string, systemdUp bool) {
	fake := t.TempDir()
	calls := filepath.Join(fake, "calls")
	// It answers that the agent runs while the file active exists.
	active := filepath.Join(fake, "active")
	script := "#!/bin/sh\necho \"$*\" >> " + calls + "\n" +
		"[ \"$*\" = \"is-active --quiet cellvisor.service\" ] && [ -e " + active + " ] && exit 0\nexit 1\n"
	if err := os.WriteFile(filepath.Join(fake, "systemctl"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	path := fake + ":" + os.Getenv("PATH")
	dpkg := func(args ...string) (string, error) { return runDpkg(path, systemdUp, args...) }
	t.Cleanup(func() {
		if out, err := dpkg("--purge", "cellvisor", "cellvisor-control"); err != nil {
			t.Errorf("cleanup: dpkg --purge: %v\n%s", err, out)
		}
	})

	// Install.
	out, err := dpkg("--install", older["cellvisor deb"], older["cellvisor-control deb"])
	if err != nil {
		t.Fatalf("dpkg --install: %v\n%s", err, out)
	}
	t.Logf("dpkg --install:\n%s", out)
	if !systemdUp && !strings.Contains(out, "cellvisor: systemd is not running") {
		t.Errorf("the scripts do not say systemd is not running:\n%s", out)
	}
	if !strings.Contains(out, "cellvisor: installed; not enabled or started") {
		t.Errorf("installation does not say the agent is not enabled:\n%s", out)
	}
	checkInstalled(t, "0.0.1~test+git1.gabc")
	checkNothingEnabled(t, calls)
	if systemdUp {
		wantCalls(t, calls, "daemon-reload", "daemon-reload")
	}

	// An operator edits agent.yaml; the agent has state.
	edited := readFile(t, "/etc/cellvisor/agent.yaml") + "# edited by the operator\n"
	if err := os.WriteFile("/etc/cellvisor/agent.yaml", []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/var/lib/cellvisor/identity.json", []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// systemd's LogsDirectory= made by the unit's first start.
	if err := os.MkdirAll("/var/log/cellvisor", 0o750); err != nil {
		t.Fatal(err)
	}

	// Upgrade: no prompt (standard input is empty), the edit and the state kept.
	out, err = dpkg("--install", newer["cellvisor deb"], newer["cellvisor-control deb"])
	if err != nil {
		t.Fatalf("dpkg --install (upgrade): %v\n%s", err, out)
	}
	t.Logf("dpkg --install (upgrade):\n%s", out)
	if strings.Contains(out, "cellvisor: installed; not enabled") {
		t.Errorf("an upgrade says it installed:\n%s", out)
	}
	checkInstalled(t, "0.0.1~test+git2.gdef")
	if got := readFile(t, "/etc/cellvisor/agent.yaml"); got != edited {
		t.Errorf("the upgrade replaced the edited agent.yaml")
	}
	if _, err := os.Stat("/var/lib/cellvisor/identity.json"); err != nil {
		t.Errorf("the upgrade lost the agent's state: %v", err)
	}
	checkNothingEnabled(t, calls)
	if systemdUp {
		wantCalls(t, calls, "daemon-reload", "daemon-reload",
			"daemon-reload", "try-restart cellvisor.service", "daemon-reload", "try-restart cellvisor-control.service")
	}

	// The dpkg trigger: a package that installs the cells' runtime (here
	// activated by hand, as dpkg does when it unpacks a file there) has a
	// running agent told at once, and a stopped one left alone.
	runTrigger(t, dpkg, "/usr/sbin/nginx")
	if err := os.WriteFile(active, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out = runTrigger(t, dpkg, "/usr/lib/nginx/modules/ngx_http_lua_module.so")
	if err := os.Remove(active); err != nil {
		t.Fatal(err)
	}
	if systemdUp && !strings.Contains(out, "cellvisor: the cells' runtime changed (/usr/lib/nginx/modules): telling the agent") {
		t.Errorf("the trigger does not say it tells the running agent:\n%s", out)
	}
	checkNothingEnabled(t, calls)
	if systemdUp {
		wantCalls(t, calls, "daemon-reload", "daemon-reload",
			"daemon-reload", "try-restart cellvisor.service", "daemon-reload", "try-restart cellvisor-control.service",
			"is-active --quiet cellvisor.service", "is-active --quiet cellvisor.service", "reload --no-block cellvisor.service")
	}

	// Purge: files, configuration, the agent's state and run directories go;
	// the users and the control API's data (its CA and keys) stay.
	out, err = dpkg("--purge", "cellvisor", "cellvisor-control")
	if err != nil {
		t.Fatalf("dpkg --purge: %v\n%s", err, out)
	}
	for _, p := range []string{
		"/usr/bin/cellvisor", "/usr/bin/cellvisor-control", "/etc/cellvisor",
		"/usr/lib/systemd/system/cellvisor.service", "/usr/lib/systemd/system/cellvisor-control.service",
		"/usr/lib/sysusers.d/cellvisor.conf", "/usr/lib/tmpfiles.d/cellvisor.conf",
		"/usr/lib/sysusers.d/cellvisor-control.conf", "/usr/lib/tmpfiles.d/cellvisor-control.conf",
		"/var/lib/cellvisor", "/run/cellvisor", "/var/log/cellvisor", "/usr/lib/systemd/system/cellvisor.slice",
	} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after purge (%v)", p, err)
		}
	}
	if _, err := os.Stat("/var/lib/cellvisor-control"); err != nil {
		t.Errorf("purge removed the control API's data (policy keeps it): %v", err)
	}
	t.Logf("dpkg --purge:\n%s", out)
	if !strings.Contains(out, "cellvisor-control: kept /var/lib/cellvisor-control") {
		t.Errorf("purge does not say it kept the control API's data:\n%s", out)
	}
	for _, name := range Packages {
		if _, err := user.Lookup(name); err != nil {
			t.Errorf("purge removed user %s (policy keeps it): %v", name, err)
		}
		if st := dpkgStatus(t, name); st != "" {
			t.Errorf("%s is still known to dpkg after purge: %s", name, st)
		}
	}
	checkNothingEnabled(t, calls)
	if systemdUp {
		wantCalls(t, calls, "daemon-reload", "daemon-reload",
			"daemon-reload", "try-restart cellvisor.service", "daemon-reload", "try-restart cellvisor-control.service",
			"is-active --quiet cellvisor.service", "is-active --quiet cellvisor.service", "reload --no-block cellvisor.service",
			"stop cellvisor.service", "is-active --quiet cellvisor-cells.scope", "is-active --quiet cellvisor.slice", "--no-reload disable cellvisor.service",
			"is-active --quiet cellvisor.service", "is-active --quiet cellvisor-cells.scope", "is-active --quiet cellvisor.slice", "daemon-reload",
			"stop cellvisor-control.service", "--no-reload disable cellvisor-control.service", "daemon-reload")
	}
}

// runTrigger activates the dpkg file trigger of path, as dpkg does when a
// package unpacks a file there, and has dpkg run the interested packages'
// postinst ("triggered"); it returns dpkg's output.
func runTrigger(t *testing.T, dpkg func(...string) (string, error), path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "dpkg-trigger", "--no-await", path).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-trigger %s: %v\n%s", path, err, out)
	}
	out, err := dpkg("--triggers-only", "--pending")
	if err != nil {
		t.Fatalf("dpkg --triggers-only (%s): %v\n%s", path, err, out)
	}
	if !strings.Contains(out, "Processing triggers for cellvisor ") {
		t.Errorf("dpkg ran no trigger of cellvisor for %s:\n%s", path, out)
	}
	t.Logf("trigger %s:\n%s", path, out)
	return out
}

// wantCalls checks the systemctl calls recorded so far, in order.
func wantCalls(t *testing.T, calls string, want ...string) {
	t.Helper()
	got := strings.Split(strings.TrimSuffix(readFile(t, calls), "\n"), "\n")
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("systemctl calls:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// checkInstalled checks users, directories, files, owners, modes, and that
// both binaries run and report version.
func checkInstalled(t *testing.T, version string) {
	t.Helper()
	for _, name := range Packages {
		u, err := user.Lookup(name)
		if err != nil {
			t.Fatalf("user %s: %v", name, err)
		}
		if u.HomeDir != "/var/lib/"+name {
			t.Errorf("user %s has home %s", name, u.HomeDir)
		}
		if _, err := user.LookupGroup(name); err != nil {
			t.Errorf("group %s: %v", name, err)
		}
		if got := strings.TrimSpace(command(t, "getent", "passwd", name)); !strings.HasSuffix(got, ":/usr/sbin/nologin") {
			t.Errorf("user %s can log in: %s", name, got)
		}
		if st := dpkgStatus(t, name); st != "install ok installed "+version+"-1" {
			t.Errorf("dpkg status of %s: %q", name, st)
		}
	}
	for _, c := range []struct {
		path  string
		mode  os.FileMode
		owner string
		group string
	}{
		{"/usr/bin/cellvisor", 0o755, "root", "root"},
		{"/usr/bin/cellvisor-control", 0o755, "root", "root"},
		{"/usr/lib/systemd/system/cellvisor.service", 0o644, "root", "root"},
		{"/usr/lib/systemd/system/cellvisor.slice", 0o644, "root", "root"},
		{"/usr/lib/systemd/system/cellvisor-control.service", 0o644, "root", "root"},
		{"/etc/cellvisor", os.ModeDir | 0o755, "root", "root"},
		{"/etc/cellvisor/agent.yaml", 0o644, "root", "root"},
		{"/etc/cellvisor/control.env", 0o640, "root", "cellvisor-control"},
		{"/var/lib/cellvisor", os.ModeDir | 0o751, "cellvisor", "cellvisor"},
		{"/run/cellvisor", os.ModeDir | 0o751, "cellvisor", "cellvisor"},
		{"/var/lib/cellvisor-control", os.ModeDir | 0o700, "cellvisor-control", "cellvisor-control"},
	} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		owner, group := lookupName(st.Uid, false), lookupName(st.Gid, true)
		if fi.Mode() != c.mode || owner != c.owner || group != c.group {
			t.Errorf("%s is %v %s:%s, want %v %s:%s", c.path, fi.Mode(), owner, group, c.mode, c.owner, c.group)
		}
	}
	// One user per cell slot, each in its own group with the agent in it.
	for _, n := range []string{"01", "32"} {
		cell := "cellvisor-cell-" + n
		if out := command(t, "id", "-nG", "cellvisor"); !slices.Contains(strings.Fields(out), cell) {
			t.Errorf("cellvisor's groups %q lack %s", strings.TrimSpace(out), cell)
		}
		if out := strings.Fields(command(t, "id", "-nG", cell)); len(out) != 1 || out[0] != cell {
			t.Errorf("%s's groups %v, want its own alone", cell, out)
		}
	}
	if got := strings.TrimSpace(command(t, "/usr/bin/cellvisor", "version")); got != "cellvisor "+version {
		t.Errorf("cellvisor version = %q, want %q", got, "cellvisor "+version)
	}
	command(t, "/usr/bin/cellvisor-control", "--help")
}

// checkNothingEnabled: no unit enabled or started, by systemctl or by a link.
func checkNothingEnabled(t *testing.T, calls string) {
	t.Helper()
	b, err := os.ReadFile(calls)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 && (f[0] == "enable" || f[0] == "start" || f[0] == "restart" || f[0] == "reenable") {
			t.Errorf("a maintainer script ran systemctl %s", l)
		}
	}
	for _, unit := range []string{"cellvisor.service", "cellvisor-control.service"} {
		link := "/etc/systemd/system/multi-user.target.wants/" + unit
		if _, err := os.Lstat(link); err == nil {
			t.Errorf("%s is enabled (%s)", unit, link)
		}
	}
}

// runDpkg runs dpkg with PATH path and no standard input (a prompt fails),
// waiting for another dpkg or apt of this host to release its lock. With
// systemdUp it runs in a mount namespace of its own with an empty
// /run/systemd/system: to the maintainer scripts, systemd runs.
func runDpkg(path string, systemdUp bool, args ...string) (string, error) {
	name := "dpkg"
	if systemdUp {
		args = append([]string{"--mount", "--propagation", "private", "sh", "-c",
			"mount -t tmpfs tmpfs /run/systemd && mkdir /run/systemd/system && exec dpkg \"$@\"", "sh"}, args...)
		name = "unshare"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), "PATH="+path, "DEBIAN_FRONTEND=noninteractive")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "locked by another process") || ctx.Err() != nil {
			return string(out), err
		}
		select {
		case <-ctx.Done():
			return string(out), err
		case <-time.After(time.Second):
		}
	}
}

// dpkgStatus is "Status Version" of a package dpkg knows (installed, half
// installed or with its configuration files left), or "" when it knows none.
func dpkgStatus(t *testing.T, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Status} ${Version}", name).Output()
	if err != nil {
		return "" // dpkg-query: no packages found matching name
	}
	if s := strings.TrimSpace(string(out)); !strings.Contains(s, "not-installed") {
		return s
	}
	return ""
}

func lookupName(id uint32, group bool) string {
	n := strconv.FormatUint(uint64(id), 10)
	if group {
		if g, err := user.LookupGroupId(n); err == nil {
			return g.Name
		}
		return n
	}
	if u, err := user.LookupId(n); err == nil {
		return u.Username
	}
	return n
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// removeUser deletes a user (and its group) the test created.
func removeUser(t *testing.T, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "userdel", name).CombinedOutput(); err != nil {
		t.Logf("cleanup: userdel %s: %v %s", name, err, out)
	}
	if _, err := user.LookupGroup(name); err == nil {
		if out, err := exec.CommandContext(ctx, "groupdel", name).CombinedOutput(); err != nil {
			t.Logf("cleanup: groupdel %s: %v %s", name, err, out)
		}
	}
}
