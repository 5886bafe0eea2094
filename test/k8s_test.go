package test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// The parts of a Kubernetes DaemonSet the FUSE node depends on. Decoded
// with KnownFields, so a misspelt field in these parts fails the test.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `yaml:"matchLabels"`
		} `yaml:"selector"`
		UpdateStrategy map[string]any `yaml:"updateStrategy"`
		Template       struct {
			Metadata struct {
				Labels map[string]string `yaml:"labels"`
			} `yaml:"metadata"`
			Spec struct {
				TerminationGracePeriodSeconds int `yaml:"terminationGracePeriodSeconds"`
				Containers                    []struct {
					Name            string   `yaml:"name"`
					Image           string   `yaml:"image"`
					ImagePullPolicy string   `yaml:"imagePullPolicy"`
					Args            []string `yaml:"args"`
					SecurityContext struct {
						Privileged   bool `yaml:"privileged"`
						Capabilities struct {
							Add []string `yaml:"add"`
						} `yaml:"capabilities"`
					} `yaml:"securityContext"`
					ReadinessProbe map[string]any `yaml:"readinessProbe"`
					Resources      map[string]any `yaml:"resources"`
					VolumeMounts   []struct {
						Name             string `yaml:"name"`
						MountPath        string `yaml:"mountPath"`
						MountPropagation string `yaml:"mountPropagation"`
					} `yaml:"volumeMounts"`
				} `yaml:"containers"`
				Volumes []struct {
					Name     string `yaml:"name"`
					HostPath struct {
						Path string `yaml:"path"`
						Type string `yaml:"type"`
					} `yaml:"hostPath"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
	} `yaml:"spec"`
}

// TestK8sDaemonSet parses contrib/k8s/daemonset.yaml and checks what FUSE
// and a clean stop need: privileges (privileged, or CAP_SYS_ADMIN with
// /dev/fuse), the data directory and the mount point as hostPath volumes at
// the paths kylix serve is given, Bidirectional propagation of the mount
// (which Kubernetes allows only in privileged containers), a grace period
// longer than --stop-timeout, and a selector that matches the pods.
func TestK8sDaemonSet(t *testing.T) {
	raw, err := os.ReadFile("../contrib/k8s/daemonset.yaml")
	require.NoError(t, err)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	var ds *k8sObject
	for {
		var o k8sObject
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "parsing contrib/k8s/daemonset.yaml")
		if o.Kind == "DaemonSet" {
			ds = &o
		}
	}
	require.NotNil(t, ds, "no DaemonSet in contrib/k8s/daemonset.yaml")
	assert.Equal(t, "apps/v1", ds.APIVersion)
	for k, v := range ds.Spec.Selector.MatchLabels {
		assert.Equal(t, v, ds.Spec.Template.Metadata.Labels[k], "selector label %s does not match the pod template", k)
	}
	assert.NotEmpty(t, ds.Spec.Selector.MatchLabels)
	pod := ds.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]

	flags := map[string]string{}
	require.NotEmpty(t, c.Args)
	assert.Equal(t, "serve", c.Args[0])
	for _, a := range c.Args[1:] {
		k, v, ok := strings.Cut(a, "=")
		require.True(t, ok, "argument %q: write flags as --name=value", a)
		flags[k] = v
	}
	data, mnt := flags["--data"], flags["--mount"]
	require.NotEmpty(t, data, "kylix serve is given no --data")
	require.NotEmpty(t, mnt, "kylix serve is given no --mount")
	stop, err := time.ParseDuration(flags["--stop-timeout"])
	require.NoError(t, err, "--stop-timeout")
	assert.Greater(t, time.Duration(pod.TerminationGracePeriodSeconds)*time.Second, stop,
		"the kubelet's SIGKILL (terminationGracePeriodSeconds) must come after the node's own --stop-timeout")

	hostPath := map[string]string{} // volume -> host path
	hostType := map[string]string{}
	for _, v := range pod.Volumes {
		hostPath[v.Name], hostType[v.Name] = v.HostPath.Path, v.HostPath.Type
	}
	mounted := map[string]string{} // container path -> volume
	propagation := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath], propagation[m.MountPath] = m.Name, m.MountPropagation
	}
	assert.Equal(t, data, hostPath[mounted[data]], "the data directory %s is not a hostPath volume at the same path", data)
	assert.Equal(t, mnt, hostPath[mounted[mnt]], "the mount point %s is not a hostPath volume at the same path", mnt)
	assert.Equal(t, "Bidirectional", propagation[mnt], "the FUSE mount reaches the host only with mountPropagation: Bidirectional")
	assert.Empty(t, propagation[data], "the data directory needs no propagation")

	sysAdmin := false
	for _, cap := range c.SecurityContext.Capabilities.Add {
		sysAdmin = sysAdmin || cap == "SYS_ADMIN" || cap == "CAP_SYS_ADMIN"
	}
	devFuse := mounted["/dev/fuse"] != "" && hostPath[mounted["/dev/fuse"]] == "/dev/fuse" && hostType[mounted["/dev/fuse"]] == "CharDevice"
	assert.True(t, c.SecurityContext.Privileged || (sysAdmin && devFuse), "mounting FUSE needs privileged, or CAP_SYS_ADMIN and /dev/fuse")
	assert.True(t, c.SecurityContext.Privileged, "Kubernetes allows mountPropagation: Bidirectional in privileged containers only")
	assert.True(t, devFuse, "/dev/fuse is not mounted from the host as a CharDevice")
	assert.NotEmpty(t, c.ReadinessProbe, "no readiness probe: pods would be ready before the mount is")
}

// TestK8sDockerfile: the image builds kylix without cgo and runs it.
func TestK8sDockerfile(t *testing.T) {
	raw, err := os.ReadFile("../contrib/k8s/Dockerfile")
	require.NoError(t, err)
	s := string(raw)
	assert.Contains(t, s, "CGO_ENABLED=0 go build")
	assert.Contains(t, s, "./cmd/kylix")
	assert.Contains(t, s, `ENTRYPOINT ["/usr/local/bin/kylix"]`)
	assert.Contains(t, s, "fuse3")
}
