package main

import (
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print fenced's module version, the Go toolchain and the source revision it was built from",
		Long: `version prints the module version fenced was built from (v0.x.y, or a
pseudo-version, for go install ...@version; "(devel)" for a build in a checkout
that Go could not stamp), the Go toolchain, and the VCS revision, its time and
whether the tree was modified, when the build recorded them (builds in a git
checkout do; go install ...@version builds from a module zip and does not).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, ok := debug.ReadBuildInfo()
			if !ok {
				return fmt.Errorf("version: the binary carries no build information")
			}
			writeVersion(g.stdout, info)
			return nil
		},
	}
}

// writeVersion prints info's module version, Go version and VCS settings.
func writeVersion(w io.Writer, info *debug.BuildInfo) {
	fmt.Fprintf(w, "fenced %s\n", info.Main.Version)
	fmt.Fprintf(w, "module %s\n", info.Main.Path)
	if info.Main.Sum != "" {
		fmt.Fprintf(w, "sum    %s\n", info.Main.Sum)
	}
	fmt.Fprintf(w, "go     %s\n", info.GoVersion)
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs", "vcs.revision", "vcs.time", "vcs.modified":
			fmt.Fprintf(w, "%-6s %s\n", s.Key, s.Value)
		}
	}
}
