package fence

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalidWrite means a Write was refused before anything was sent. It has
// one of four causes. A fragment could change the statement's structure (a
// comment, a semicolon, unbalanced brackets, an unterminated literal). A
// placeholder count does not match the arguments. Placeholders are of
// another dialect. An assignment goes to one of the guard's own columns. The
// error names the fragment, the byte offset and what was wrong.
var ErrInvalidWrite = errors.New("fence: invalid write")

// fragment is what scanFragment learned about a Write.Set or Write.Where.
type fragment struct {
	// questions counts ? outside literals. On SQLite and MySQL they are the
	// placeholders; on PostgreSQL they can only be jsonb operators, or a
	// placeholder of the wrong dialect.
	questions int
	// params lists the numbers of PostgreSQL's $n placeholders, in order.
	params []int
	// targets are the assignment targets of a Set at bracket depth 0,
	// unquoted (the last part of a qualified name).
	targets []string
}

// isIdentByte reports whether c can continue an identifier or a number.
// Bytes of multi-byte UTF-8 characters count as identifier bytes, which is
// what the three databases do.
func isIdentByte(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 || ('0' <= c && c <= '9') || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// scanFragment checks a Set or Where fragment for d (what is "Set" or
// "Where") and returns its placeholders and assignment targets.
//
// The scanner is deliberately stricter than any of the three SQL lexers:
// whatever it accepts is lexed the same way by all of them, so a fragment
// cannot hide a comment or a bracket from it. Quoted spans ('…', "…", and
// `…` on MySQL and SQLite, […] on SQLite) are skipped, with a doubled quote
// as the only escape. Backslashes are refused everywhere: MySQL treats them
// as escapes inside literals, and the other dialects do not.
func scanFragment(d Dialect, what, s string) (fragment, error) {
	var f fragment
	fail := func(at int, format string, args ...any) (fragment, error) {
		return fragment{}, fmt.Errorf("%w: %s fragment %q at byte %d: %s", ErrInvalidWrite, what, s, at, fmt.Sprintf(format, args...))
	}
	var stack []byte // open brackets
	itemStart := 0   // start of the current depth-0 item of a Set
	lhsDone := false // the current item's '=' has been seen
	for i := 0; i < len(s); {
		c := s[i]
		var next byte
		if i+1 < len(s) {
			next = s[i+1]
		}
		switch {
		case c == '\\':
			return fail(i, "backslash (MySQL reads it as an escape inside literals, the others do not); pass the value as an argument")
		case c == 0x7f || (c < ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f'):
			return fail(i, "control character %#02x", c)
		case c == '\'' || c == '"' || (c == '`' && d != Postgres) || (c == '[' && d == SQLite):
			end, err := quotedEnd(s, i)
			if err != "" {
				return fail(i, "%s", err)
			}
			i = end
			continue
		case c == '`':
			return fail(i, "backtick (PostgreSQL quotes identifiers with \")")
		case c == '-' && next == '-', c == '/' && next == '*', c == '#' && d == MySQL:
			return fail(i, "comment (%c%c): comments are not allowed in fragments", c, next)
		case c == ';':
			return fail(i, "semicolon: a fragment is part of one statement")
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, c)
		case c == ')' || c == ']' || c == '}':
			open := map[byte]byte{')': '(', ']': '[', '}': '{'}[c]
			if len(stack) == 0 {
				return fail(i, "unbalanced %q: closes a bracket the fragment did not open", c)
			}
			if stack[len(stack)-1] != open {
				return fail(i, "unbalanced %q: closes %q", c, stack[len(stack)-1])
			}
			stack = stack[:len(stack)-1]
		case c == ',' && len(stack) == 0:
			itemStart, lhsDone = i+1, false
		case c == '=' && len(stack) == 0 && !lhsDone:
			prev := byte(0)
			if i > 0 {
				prev = s[i-1]
			}
			if !strings.ContainsRune("<>!:=", rune(prev)) && next != '=' {
				f.targets = append(f.targets, assignmentTargets(s[itemStart:i])...)
				lhsDone = true
			}
		case c == '?':
			if d == SQLite && isDigit(next) {
				return fail(i, "numbered placeholder ?%c…: write plain ? placeholders, one per argument in order", next)
			}
			f.questions++
		case c == '$' && (i == 0 || !isIdentByte(s[i-1])):
			switch {
			case isDigit(next) && d == Postgres:
				n := 0
				j := i + 1
				for ; j < len(s) && isDigit(s[j]); j++ {
					if n > 1<<20 {
						return fail(i, "placeholder number too large")
					}
					n = n*10 + int(s[j]-'0')
				}
				f.params = append(f.params, n)
				i = j
				continue
			case isDigit(next):
				return fail(i, "$%c is a PostgreSQL placeholder; %s placeholders are ?", next, d)
			case d == Postgres:
				return fail(i, "$ starts a dollar-quoted string; use '…' literals or arguments")
			case d == SQLite:
				return fail(i, "$name is a named parameter in SQLite; use ? placeholders")
			}
		case (c == ':' || c == '@') && d == SQLite && (isIdentByte(next) && next != '$'):
			return fail(i, "%c%c… is a named parameter in SQLite; use ? placeholders", c, next)
		}
		i++
	}
	if len(stack) > 0 {
		return fail(len(s), "unbalanced %q: never closed", stack[len(stack)-1])
	}
	return f, nil
}

// quotedEnd returns the index just past the quoted span starting at s[i],
// or a reason it is not acceptable.
func quotedEnd(s string, i int) (int, string) {
	open := s[i]
	closing := open
	if open == '[' {
		closing = ']'
	}
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			return 0, "backslash inside a quoted span (MySQL reads it as an escape, the others do not); pass the value as an argument"
		case 0:
			return 0, "NUL byte inside a quoted span"
		case closing:
			if closing != ']' && j+1 < len(s) && s[j+1] == closing {
				j++ // doubled quote: an escaped quote character
				continue
			}
			return j + 1, ""
		}
	}
	return 0, fmt.Sprintf("unterminated %c…%c", open, closing)
}

// assignmentTargets returns the column names assigned by the left-hand side
// of one Set item: "col", "t.col", a quoted name, or PostgreSQL's
// "(a, b)" row form.
func assignmentTargets(lhs string) []string {
	lhs = strings.TrimSpace(lhs)
	lhs = strings.TrimSuffix(strings.TrimPrefix(lhs, "("), ")")
	var out []string
	for _, part := range strings.Split(lhs, ",") {
		part = strings.TrimSpace(part)
		if k := strings.LastIndexByte(part, '.'); k >= 0 {
			part = part[k+1:]
		}
		if len(part) >= 2 && strings.ContainsRune("\"`[", rune(part[0])) {
			part = part[1 : len(part)-1]
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

// checkWrite validates w for the guard's dialect and columns, before
// anything is sent. Errors match ErrInvalidWrite.
func (g *SQL) checkWrite(w Write) error {
	set, where := strings.TrimSpace(w.Set), strings.TrimSpace(w.Where)
	if set == "" && len(w.SetArgs) > 0 {
		return fmt.Errorf("%w: SetArgs given without Set", ErrInvalidWrite)
	}
	if where == "" && len(w.WhereArgs) > 0 {
		return fmt.Errorf("%w: WhereArgs given without Where", ErrInvalidWrite)
	}
	if set != "" {
		f, err := scanFragment(g.dialect, "Set", w.Set)
		if err != nil {
			return err
		}
		if err := g.checkArgs("Set", w.Set, f, 1, len(w.SetArgs)); err != nil {
			return err
		}
		for _, target := range f.targets {
			for _, own := range []string{g.table.FenceColumn, g.table.OwnerColumn, g.table.LeaseKeyColumn} {
				if strings.EqualFold(target, own) {
					return fmt.Errorf(
						"%w: Set fragment %q assigns %s, one of the guard's own columns: "+
							"the guard writes the fence, owner and lease key itself",
						ErrInvalidWrite, w.Set, own)
				}
			}
		}
	}
	if where != "" {
		f, err := scanFragment(g.dialect, "Where", w.Where)
		if err != nil {
			return err
		}
		if err := g.checkArgs("Where", w.Where, f, len(w.SetArgs)+1, len(w.WhereArgs)); err != nil {
			return err
		}
	}
	return nil
}

// checkArgs compares a fragment's placeholders with its arguments. first
// is the number its PostgreSQL placeholders start at, n the number of
// arguments it has.
func (g *SQL) checkArgs(what, s string, f fragment, first, n int) error {
	if g.dialect != Postgres {
		if f.questions != n {
			return fmt.Errorf("%w: %s fragment %q has %d ? placeholder(s) but %d argument(s) in %sArgs",
				ErrInvalidWrite, what, s, f.questions, n, what)
		}
		return nil
	}
	last := first + n - 1
	span := fmt.Sprintf("$%d..$%d", first, last)
	if n == 0 {
		span = "none"
	}
	if len(f.params) == 0 && f.questions > 0 && n > 0 {
		return fmt.Errorf("%w: %s fragment %q uses ? placeholders; PostgreSQL numbers them: write $1, $2, … (here %s)",
			ErrInvalidWrite, what, s, span)
	}
	used := make([]bool, n)
	for _, p := range f.params {
		if p < first || p > last {
			return fmt.Errorf("%w: %s fragment %q uses $%d, but its arguments are %s (Where continues after SetArgs)",
				ErrInvalidWrite, what, s, p, span)
		}
		used[p-first] = true
	}
	for i, u := range used {
		if !u {
			return fmt.Errorf("%w: %s fragment %q never uses $%d, but %sArgs has an argument for it",
				ErrInvalidWrite, what, s, first+i, what)
		}
	}
	return nil
}
