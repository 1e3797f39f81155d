package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestDeployStopTimeouts: the systemd unit and the Kubernetes manifest
// send SIGKILL some time after shutdownLimit, so that a shutdown that
// hangs writes its goroutines' stacks first, and the docs that give these
// numbers give the same.
func TestDeployStopTimeouts(t *testing.T) {
	const margin = 10 * time.Second
	root := repoRoot(t)
	read := func(file string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(b)), " ") // lines wrapped anywhere
	}
	find := func(file, re string) time.Duration {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(read(file))
		if m == nil {
			t.Fatalf("%s: nothing matches %s", file, re)
		}
		n, err := strconv.Atoi(m[1])
		if err != nil {
			t.Fatalf("%s: %s: %v", file, m[0], err)
		}
		return time.Duration(n) * time.Second
	}

	unit := find("deploy/systemd/tidemark.service", `(?:^| )TimeoutStopSec=(\d+)s(?: |$)`)
	var manifest struct {
		Spec struct {
			Template struct {
				Spec struct {
					Grace *int `yaml:"terminationGracePeriodSeconds"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy/kubernetes/deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &manifest); err != nil || manifest.Spec.Template.Spec.Grace == nil {
		t.Fatalf("deploy/kubernetes/deployment.yaml: no terminationGracePeriodSeconds (%v)", err)
	}
	grace := time.Duration(*manifest.Spec.Template.Spec.Grace) * time.Second
	for what, d := range map[string]time.Duration{"TimeoutStopSec": unit, "terminationGracePeriodSeconds": grace} {
		if d < shutdownLimit+margin {
			t.Errorf("%s is %s: SIGKILL would race the goroutine dump at the shutdown limit, %s; want at least %s", what, d, shutdownLimit, shutdownLimit+margin)
		}
	}
	if grace != unit {
		t.Errorf("terminationGracePeriodSeconds is %s, TimeoutStopSec %s: want one time", grace, unit)
	}
	for _, doc := range []struct{ file, re string }{
		{"deploy/README.md", "`TimeoutStopSec=(\\d+)s`"},
		{"deploy/README.md", "`terminationGracePeriodSeconds: (\\d+)`"},
		{"README.md", `stop with SIGTERM, allowing (\d+) seconds`},
		{"docs/commands.md", `Allow (\d+) seconds between SIGTERM and SIGKILL`},
		{"docs/runbook.md", `Stop with SIGTERM and allow (\d+) seconds before SIGKILL`},
	} {
		if d := find(doc.file, doc.re); d != unit {
			t.Errorf("%s says %s where the deploy files give %s", doc.file, d, unit)
		}
	}
	if d := find("docs/commands.md", "longer than (\\d+) seconds logs `shutdown did not finish in time`"); d != shutdownLimit {
		t.Errorf("docs/commands.md gives %s as the shutdown limit, the code %s", d, shutdownLimit)
	}
}
