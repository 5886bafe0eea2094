package testneeds

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestMissingFailsUnlessAllowed runs a test that calls Missing in a child
// process, once plain and once with KYLIX_TEST_ALLOW_SKIP=1, and checks it
// fails the first time and skips the second.
func TestMissingFailsUnlessAllowed(t *testing.T) {
	if os.Getenv("TESTNEEDS_CHILD") == "1" {
		Command(t, "kylix-no-such-client", "kylix-no-such-package")
		t.Fatal("Command returned for a missing program")
	}
	for _, allow := range []string{"", "1"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMissingFailsUnlessAllowed$", "-test.v")
		cmd.Env = append(os.Environ(), "TESTNEEDS_CHILD=1", AllowSkipEnv+"="+allow)
		out, err := cmd.CombinedOutput()
		s := string(out)
		if !strings.Contains(s, "kylix-no-such-client not found (apt-get install -y kylix-no-such-package)") {
			t.Errorf("%s=%q: output does not name the client and its package:\n%s", AllowSkipEnv, allow, s)
		}
		switch allow {
		case "":
			if err == nil || !strings.Contains(s, "--- FAIL") {
				t.Errorf("without %s the missing client did not fail the test (err %v):\n%s", AllowSkipEnv, err, s)
			}
		case "1":
			if err != nil || !strings.Contains(s, "--- SKIP") {
				t.Errorf("with %s=1 the missing client did not skip the test (err %v):\n%s", AllowSkipEnv, err, s)
			}
		}
	}
}

func TestCommandFindsPresentProgram(t *testing.T) {
	if p := Command(t, "sh", "dash"); p == "" {
		t.Fatal("no path for sh")
	}
}
