package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kylix/kylix/gpuio"
)

// generated is the Python module, relative to this package's directory.
var generated = filepath.Join("..", "..", "..", "contrib", "python", "kylix", "_tp_rules.py")

// TestGeneratedPythonIsCurrent: the Python table on disk is what the
// generator writes from the Go table now, so kylix.split and kylix load
// --tp-size cannot drift apart.
func TestGeneratedPythonIsCurrent(t *testing.T) {
	want, err := render(gpuio.TPRules())
	require.NoError(t, err)
	got, err := os.ReadFile(generated)
	require.NoError(t, err, "the generated Python rules are missing: run go generate ./gpuio")
	if string(got) != string(want) {
		t.Fatalf("%s is stale: gpuio.TPRules changed since it was generated; run go generate ./gpuio and commit it", generated)
	}
}

// TestRenderRefusesWhatPythonWouldMisread: a pattern that a raw string
// cannot carry, or a dim that is neither a dimension nor Replicate, stops
// the generator instead of writing a module that means something else.
func TestRenderRefusesWhatPythonWouldMisread(t *testing.T) {
	for _, r := range []gpuio.TPRule{
		{Layer: "quote", Pattern: `a"b`, Dim: 0},
		{Layer: "backslash", Pattern: `a\`, Dim: 0},
		{Layer: "dim", Pattern: `a`, Dim: -2},
		{Layer: `q"uote`, Pattern: `a`, Dim: 0},
	} {
		_, err := render([]gpuio.TPRule{r})
		require.Error(t, err, "rule %+v", r)
	}
	b, err := render([]gpuio.TPRule{{Layer: "x", Pattern: `(^|\.)x\.weight$`, Dim: gpuio.Replicate}})
	require.NoError(t, err)
	require.Contains(t, string(b), "r\"(^|\\.)x\\.weight$\",\n     None),")
}
