package proof

import (
	"bytes"
	"io"
	"os"
)

// updateRowsSection rewrites one section of the report at path (see
// updateSection) with what write makes of the rows kept in rowsPath.
func updateRowsSection[R any](path, rowsPath string, write func(io.Writer, []R), begin, end, before string) error {
	rows, err := readRows[R](rowsPath)
	if err != nil {
		return err
	}
	var sec bytes.Buffer
	write(&sec, rows)
	return updateSection(path, begin, end, before, sec.Bytes())
}

// updateSection rewrites the part of the report at path between the
// marker lines begin and end (both included in sec) with sec, inserting
// it before the heading line before (or at the end) if the report has
// none, so one section is regenerated without rerunning the rest.
func updateSection(path, begin, end, before string, sec []byte) error {
	md, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i, j := bytes.Index(md, []byte(begin)), bytes.Index(md, []byte(end))
	var out []byte
	switch k := bytes.Index(md, []byte("\n"+before+"\n")); {
	case i >= 0 && j > i:
		rest := md[j+len(end):]
		rest = bytes.TrimPrefix(rest, []byte("\n"))
		out = append(append(append(out, md[:i]...), sec...), rest...)
	case k >= 0:
		out = append(append(append(append(out, md[:k+1]...), sec...), '\n'), md[k+1:]...)
	default:
		out = append(append(md, '\n'), sec...)
	}
	return os.WriteFile(path, out, 0o644)
}
