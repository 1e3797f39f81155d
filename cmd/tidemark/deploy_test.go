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
// hangs writes its goroutines' stacks first, and docs/commands.md, the
// one doc that gives these numbers, gives the same.
func TestDeployStopTimeouts(t *testing.T) {
	const (
		margin      = 10 * time.Second
		stopTimeDoc = "docs/commands.md"
	)
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
	if d := find("deploy/README.md", `docker run [^\\]*--stop-timeout (\d+)`); d != unit {
		t.Errorf("deploy/README.md's docker run gives --stop-timeout %s, the other deploy files %s", d, unit)
	}
	// docs/commands.md states the stop time; the other docs that speak of
	// stopping link to it, and none states one of its own.
	if d := find(stopTimeDoc, `Allow (\d+) seconds between SIGTERM and SIGKILL`); d != unit {
		t.Errorf("%s says %s where the deploy files give %s", stopTimeDoc, d, unit)
	}
	stated := regexp.MustCompile(`(?i)\ballow(?:ing)? \d+ ?s(?:econds)?\b|\b\d+ ?s(?:econds)? (?:between SIGTERM and SIGKILL|before SIGKILL)|TimeoutStopSec=\d+|terminationGracePeriodSeconds: \d+`)
	for _, file := range docFiles(t, root) {
		if file == stopTimeDoc {
			continue
		}
		if m := stated.FindString(read(file)); m != "" {
			t.Errorf("%s states a stop time (%q); link to %s#signals-and-shutdown instead", file, m, stopTimeDoc)
		}
	}
	for _, file := range []string{"README.md", "docs/runbook.md", "deploy/README.md"} {
		if !strings.Contains(read(file), "commands.md#signals-and-shutdown") {
			t.Errorf("%s does not link to %s#signals-and-shutdown for the stop time", file, stopTimeDoc)
		}
	}
	if d := find("docs/commands.md", "longer than (\\d+) seconds logs `shutdown did not finish in time`"); d != shutdownLimit {
		t.Errorf("docs/commands.md gives %s as the shutdown limit, the code %s", d, shutdownLimit)
	}
}
