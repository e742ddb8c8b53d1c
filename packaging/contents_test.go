package packaging

import (
	"debug/elf"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const testVersion = "0.0.1~test+git1.gabc"

// file is one packaged file as a test expects it.
type file struct {
	path, mode, owner, group string
}

var wantFiles = map[string][]file{
	"cellvisor": {
		{"/usr/bin/cellvisor", "-rwxr-xr-x", "root", "root"},
		{"/usr/lib/systemd/system/cellvisor.service", "-rw-r--r--", "root", "root"},
		{"/usr/lib/systemd/system/cellvisor.slice", "-rw-r--r--", "root", "root"},
		{"/usr/lib/sysusers.d/cellvisor.conf", "-rw-r--r--", "root", "root"},
		{"/usr/lib/tmpfiles.d/cellvisor.conf", "-rw-r--r--", "root", "root"},
		{"/etc/cellvisor/agent.yaml", "-rw-r--r--", "root", "root"},
	},
	"cellvisor-control": {
		{"/usr/bin/cellvisor-control", "-rwxr-xr-x", "root", "root"},
		{"/usr/lib/systemd/system/cellvisor-control.service", "-rw-r--r--", "root", "root"},
		{"/usr/lib/sysusers.d/cellvisor-control.conf", "-rw-r--r--", "root", "root"},
		{"/usr/lib/tmpfiles.d/cellvisor-control.conf", "-rw-r--r--", "root", "root"},
		{"/etc/cellvisor/control.env", "-rw-r-----", "root", "root"},
	},
}

var wantConfig = map[string]string{
	"cellvisor":         "/etc/cellvisor/agent.yaml",
	"cellvisor-control": "/etc/cellvisor/control.env",
}

// TestDebContents reads the built .debs with dpkg-deb: metadata, files with
// their modes and owners, the conffile, the maintainer scripts.
func TestDebContents(t *testing.T) {
	requireTool(t, "dpkg-deb", "to read .deb packages")
	pkgs := packagesFor(t, testVersion)
	for _, name := range Packages {
		t.Run(name, func(t *testing.T) {
			deb := pkgs[name+" deb"]
			info := command(t, "dpkg-deb", "--field", deb, "Package", "Version", "Architecture", "Depends")
			for _, want := range []string{"Package: " + name + "\n", "Version: " + testVersion + "-1\n"} {
				if !strings.Contains(info, want) {
					t.Errorf("control fields lack %q:\n%s", want, info)
				}
			}
			depends := ""
			if name == "cellvisor" {
				depends = "Depends: openresty | libnginx-mod-http-lua, openresty | lua-cjson\n"
			}
			if got := fieldLine(info, "Depends"); got != depends {
				t.Errorf("Depends line %q, want %q", got, depends)
			}

			listing := command(t, "dpkg-deb", "--contents", deb)
			for _, f := range wantFiles[name] {
				re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(f.mode) + ` ` + f.owner + `/` + f.group + ` .* \.` + regexp.QuoteMeta(f.path) + `$`)
				if !re.MatchString(listing) {
					t.Errorf("no %s %s:%s %s in:\n%s", f.mode, f.owner, f.group, f.path, listing)
				}
			}
			if strings.Contains(listing, "./var/") || strings.Contains(listing, "./run/") {
				t.Errorf("the package ships state or run files (the scripts create them):\n%s", listing)
			}

			dir := t.TempDir()
			command(t, "dpkg-deb", "--control", deb, dir)
			conffiles := command(t, "cat", dir+"/conffiles")
			if strings.TrimSpace(conffiles) != wantConfig[name] {
				t.Errorf("conffiles %q, want %q", conffiles, wantConfig[name])
			}
			if name == "cellvisor" {
				// dpkg file triggers on the cells' runtime (deb-triggers(5)).
				want := "interest-noawait /usr/sbin/nginx\ninterest-noawait /usr/lib/nginx/modules\ninterest-noawait /usr/local/openresty/nginx/sbin/nginx\n"
				if got := command(t, "cat", dir+"/triggers"); got != want {
					t.Errorf("triggers %q, want %q", got, want)
				}
			}
			for _, s := range []string{"postinst", "prerm", "postrm"} {
				body := command(t, "cat", dir+"/"+s)
				if !strings.HasPrefix(body, "#!/bin/sh\n") || !strings.Contains(body, "name="+name+"\n") {
					t.Errorf("%s is not %s's script:\n%.200s", s, name, body)
				}
			}
		})
	}
}

// The packaged binaries are static: an edge host runs them whatever its C
// library, and the agent starts without the dynamic loader.
func TestPackagedBinariesAreStatic(t *testing.T) {
	requireTool(t, "dpkg-deb", "to read .deb packages")
	pkgs := packagesFor(t, testVersion)
	for _, name := range Packages {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			command(t, "dpkg-deb", "-x", pkgs[name+" deb"], dir)
			f, err := elf.Open(filepath.Join(dir, "usr", "bin", name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("/usr/bin/%s asks for a dynamic loader: built with cgo", name)
				}
			}
			if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
				t.Errorf("/usr/bin/%s links %v (%v), want no shared library", name, libs, err)
			}
		})
	}
}

// TestRPMContents reads the built .rpms with rpm -qp: metadata, the rich
// dependencies, files with modes and owners, %config(noreplace), scripts.
func TestRPMContents(t *testing.T) {
	requireTool(t, "rpm", "to read .rpm packages")
	pkgs := packagesFor(t, testVersion)
	for _, name := range Packages {
		t.Run(name, func(t *testing.T) {
			rpm := pkgs[name+" rpm"]
			info := command(t, "rpm", "-qp", "--info", rpm)
			for _, want := range []string{"Name        : " + name + "\n", "Version     : 0.0.1~test+git1.gabc\n", "Release     : 1\n", "License     : Proprietary\n"} {
				if !strings.Contains(info, want) {
					t.Errorf("rpm --info lacks %q:\n%s", want, info)
				}
			}
			var requires []string
			for _, r := range strings.Split(command(t, "rpm", "-qp", "--requires", rpm), "\n") {
				if r != "" && !strings.HasPrefix(r, "rpmlib(") && !strings.HasPrefix(r, "/bin/sh") {
					requires = append(requires, r)
				}
			}
			want := ""
			if name == "cellvisor" {
				want = "(openresty or nginx-mod-http-lua),(openresty or lua-cjson)"
			}
			if got := strings.Join(requires, ","); got != want {
				t.Errorf("Requires %q, want %q", got, want)
			}

			files := command(t, "rpm", "-qp", "--qf", `[%{FILEMODES:perms} %{FILEUSERNAME} %{FILEGROUPNAME} %{FILEFLAGS:fflags} %{FILENAMES}\n]`, rpm)
			for _, f := range wantFiles[name] {
				flags := ""
				if f.path == wantConfig[name] {
					flags = "cn" // %config(noreplace)
				}
				line := strings.Join([]string{f.mode, f.owner, f.group, flags, f.path}, " ")
				if !strings.Contains(files, line+"\n") {
					t.Errorf("no %q in:\n%s", line, files)
				}
			}
			scripts := command(t, "rpm", "-qp", "--scripts", rpm)
			for _, s := range []string{"postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet"} {
				if !strings.Contains(scripts, s) {
					t.Errorf("no %s in:\n%s", s, scripts)
				}
			}
			if !strings.Contains(scripts, "name="+name+"\n") {
				t.Errorf("the scripts are not %s's", name)
			}
		})
	}
}

// fieldLine returns the line "Key: ..." of a control stanza, with its newline,
// or "".
func fieldLine(stanza, key string) string {
	for _, l := range strings.SplitAfter(stanza, "\n") {
		if strings.HasPrefix(l, key+": ") {
			return l
		}
	}
	return ""
}
