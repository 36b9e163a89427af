// attacker: a command tree that tries every escape from its supervisor at
// once, each escapee writing with the fence it was started with. It
// ignores SIGTERM, SIGINT, SIGHUP and the terminal stop signals (inherited
// by all), then starts:
//   setsid   a child that leaves the session;
//   double   a grandchild whose parent exits (re-parented away);
//   thread   a child that leaves the session and ends its main thread
//            (pthread_exit), writing from a second thread (a zombie that
//            writes);
//   stopper  a child that leaves the session and stops itself (SIGSTOP)
//            between writes, with a helper ("cont") that continues it;
//   leader   the process itself, after the others.
// Every write ATTEMPT is one line appended to OUT with a single write(2):
// "fence=<FENCED_FENCE> <CLOCK_MONOTONIC ns, read just before> <kind>
// <pid>". Each process appends "<kind> <pid>" to PIDS when it starts.
//
// usage: attacker OUT PIDS INTERVAL_MS
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *out, *pids;
static int interval_ms;

static void append(const char *path, const char *line) {
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
	if (fd < 0)
		return;
	ssize_t n = write(fd, line, strlen(line));
	(void)n;
	close(fd);
}

static void started(const char *kind) {
	char line[64];
	snprintf(line, sizeof line, "%s %d\n", kind, getpid());
	append(pids, line);
}

// attempt records one write attempt with the fence and the time.
static void attempt(const char *kind) {
	const char *fence = getenv("FENCED_FENCE");
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	char line[160];
	snprintf(line, sizeof line, "fence=%s %lld %s %d\n", fence ? fence : "", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, kind, getpid());
	append(out, line);
}

static void nap(void) { usleep(interval_ms * 1000); }

static void writeloop(const char *kind) {
	started(kind);
	for (;;) {
		attempt(kind);
		nap();
	}
}

static void *threadwriter(void *arg) {
	writeloop("thread");
	return arg;
}

int main(int argc, char **argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: attacker OUT PIDS INTERVAL_MS\n");
		return 2;
	}
	out = argv[1];
	pids = argv[2];
	interval_ms = atoi(argv[3]);
	int ignored[] = {SIGTERM, SIGINT, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU};
	for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
		signal(ignored[i], SIG_IGN);

	if (fork() == 0) {
		setsid();
		writeloop("setsid");
	}
	if (fork() == 0) {
		if (fork() == 0)
			writeloop("double");
		_exit(0);
	}
	if (fork() == 0) {
		setsid();
		pthread_t th;
		if (pthread_create(&th, NULL, threadwriter, NULL) != 0)
			_exit(1);
		pthread_exit(NULL);
	}
	if (fork() == 0) {
		setsid();
		pid_t self = getpid();
		if (fork() == 0) {
			started("cont");
			for (;;) {
				kill(self, SIGCONT);
				attempt("cont");
				nap();
			}
		}
		started("stopper");
		for (;;) {
			attempt("stopper");
			raise(SIGSTOP);
		}
	}
	writeloop("leader");
}
