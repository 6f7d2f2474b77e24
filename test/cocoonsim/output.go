package cocoonsim

import (
	"encoding/json"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// outputJSON prints v the way cocoon's OutputJSON does: indented by two spaces.
func outputJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// addFormatFlag adds the list commands' -o/--format table|json.
func addFormatFlag(cmd *cobra.Command) {
	cmd.Flags().StringP("format", "o", "table", `output format: "table" or "json"`)
}

// addOutputFlag adds the lifecycle commands' -o/--output json.
func addOutputFlag(cmd *cobra.Command) {
	cmd.Flags().StringP("output", "o", "", `emit "json" for machine-readable output`)
}

func wantJSON(cmd *cobra.Command) bool {
	out, _ := cmd.Flags().GetString("output")
	return out == "json"
}

// outputFormatted prints data as JSON or as a table, per --format.
func outputFormatted(cmd *cobra.Command, data any, table func(w io.Writer)) error {
	if format, _ := cmd.Flags().GetString("format"); format == "json" {
		return outputJSON(cmd.OutOrStdout(), data)
	}
	w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
	table(w)
	return w.Flush()
}
