package urlquery

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

func TestStrict(t *testing.T) {
	if _, err := Parse("table=a;drop"); !errors.Is(err, fenced.ErrInvalidURL) {
		t.Errorf("a semicolon: %v, want ErrInvalidURL", err)
	}
	p, err := Parse("table=a&table=b&x=1&busy=2s")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Take("table"); !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), "table= given 2 times") {
		t.Errorf("repeated: %v", err)
	}
	if v, ok, err := p.Take("busy"); v != "2s" || !ok || err != nil {
		t.Errorf("Take(busy) = %q, %v, %v", v, ok, err)
	}
	if _, ok, err := p.Take("busy"); ok || err != nil {
		t.Errorf("a taken parameter is still there: %v, %v", ok, err)
	}
	if err := p.NoRest("table", "busy"); !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), `unknown parameter "x" (known: table, busy)`) {
		t.Errorf("NoRest: %v", err)
	}
	if got := p.Rest().Encode(); got != "x=1" {
		t.Errorf("Rest = %q", got)
	}
}

func TestTakeDuration(t *testing.T) {
	p, err := Parse("a=250ms&zero=0s&neg=-1s&word=soon&twice=1s&twice=2s")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok, err := p.TakeDuration("a"); d != 250*time.Millisecond || !ok || err != nil {
		t.Errorf("TakeDuration(a) = %v, %v, %v", d, ok, err)
	}
	if d, ok, err := p.TakeDuration("absent"); d != 0 || ok || err != nil {
		t.Errorf("TakeDuration(absent) = %v, %v, %v", d, ok, err)
	}
	for _, name := range []string{"zero", "neg", "word", "twice"} {
		if _, ok, err := p.TakeDuration(name); !ok || !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), name+"=") {
			t.Errorf("TakeDuration(%s) = %v, %v; want ErrInvalidURL naming it", name, ok, err)
		}
	}
}

func TestTakeBool(t *testing.T) {
	p, err := Parse("a=1&b=OFF&c=Yes&bad=maybe&twice=1&twice=0")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"a": true, "b": false, "c": true} {
		if b, ok, err := p.TakeBool(name); b != want || !ok || err != nil {
			t.Errorf("TakeBool(%s) = %v, %v, %v; want %v", name, b, ok, err, want)
		}
	}
	if b, ok, err := p.TakeBool("absent"); b || ok || err != nil {
		t.Errorf("TakeBool(absent) = %v, %v, %v", b, ok, err)
	}
	for _, name := range []string{"bad", "twice"} {
		if _, _, err := p.TakeBool(name); !errors.Is(err, fenced.ErrInvalidURL) || !strings.Contains(err.Error(), name+"=") {
			t.Errorf("TakeBool(%s): %v, want ErrInvalidURL naming it", name, err)
		}
	}
}

func TestEncode(t *testing.T) {
	v := url.Values{"options": {"-c a=b+c"}}
	if got := Encode(v); got != "options=-c%20a%3Db%2Bc" {
		t.Errorf("Encode = %q", got)
	}
}
