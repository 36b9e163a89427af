package testenv_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/internal/testkit/testenv"
)

// A client that closes its connection in the middle of a request must not
// take dynalite down (dynalite 4.0.0 throws from the request's error
// handler; the preload keeps it alive, as a real DynamoDB would stay up).
func TestDynaliteSurvivesAbortedRequests(t *testing.T) {
	d := testenv.StartDynalite(t, testenv.DynaliteConfig{})
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", testenv.Addr(d.Port))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-amz-json-1.0\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{\"Li", testenv.Addr(d.Port))
		time.Sleep(50 * time.Millisecond)
		c.Close()
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-d.Exited():
		t.Fatalf("dynalite died after clients aborted their requests:\n%s", d.Log.String())
	default:
	}
	d.WaitPort(t, testenv.Addr(d.Port), 5*time.Second)
}
