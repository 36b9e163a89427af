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
//   cgnest   (with MOUNT) a child that makes a cgroup inside its own
//            ("attacker-nest-<pid>"), moves itself there, leaves the
//            session and ends its main thread, writing from a second one;
//   cgaway   (with AWAY) a child that moves itself into the cgroup
//            directory AWAY (another cgroup: a sibling, the root, a
//            systemd scope), leaves the session and ends its main thread,
//            writing from a second one;
//   leader   the process itself, after the others.
// A cgroup escapee appends "<kind> <pid>" to PIDS only once it has moved;
// if it cannot move, it appends "error <kind>: <what>: <strerror>" and
// exits, so that the test can say why rather than prove nothing.
// Every write ATTEMPT is one line appended to OUT with a single write(2):
// "fence=<FENCED_FENCE> <CLOCK_MONOTONIC ns, read just before> <kind>
// <pid>". Each process appends "<kind> <pid>" to PIDS when it starts.
//
// usage: attacker OUT PIDS INTERVAL_MS [MOUNT [AWAY]]
// (MOUNT: the cgroup2 mount point)
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
	writeloop((const char *)arg);
	return arg;
}

// cgfail records that kind could not move (what failed, and errno) and
// exits.
static void cgfail(const char *kind, const char *what) {
	char line[600];
	snprintf(line, sizeof line, "error %s: %s: %s\n", kind, what, strerror(errno));
	append(pids, line);
	_exit(3);
}

// cgmove moves this process into the cgroup directory dir (kind names it
// in an error).
static void cgmove(const char *kind, const char *dir) {
	char procs[4200], self[32];
	snprintf(procs, sizeof procs, "%s/cgroup.procs", dir);
	snprintf(self, sizeof self, "%d", getpid());
	int fd = open(procs, O_WRONLY);
	if (fd < 0 || write(fd, self, strlen(self)) < 0)
		cgfail(kind, procs);
	close(fd);
}

// nestdir writes to dir a new cgroup inside this process's own, under the
// cgroup2 mount point mount, and makes it.
static void nestdir(const char *kind, const char *mount, char *dir, size_t n) {
	FILE *f = fopen("/proc/self/cgroup", "r");
	if (!f)
		cgfail(kind, "/proc/self/cgroup");
	char line[4000];
	int found = 0;
	while (!found && fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3) == 0) {
			line[strcspn(line, "\n")] = 0;
			found = 1;
		}
	}
	fclose(f);
	if (!found) {
		errno = ENOENT;
		cgfail(kind, "no 0:: line in /proc/self/cgroup");
	}
	snprintf(dir, n, "%s%s/attacker-nest-%d", mount, strcmp(line + 3, "/") == 0 ? "" : line + 3, getpid());
	// A cgroup of this name left by an earlier, killed run (whose
	// attacker had this process ID) is removed if empty, then made anew.
	if (mkdir(dir, 0755) != 0 && (errno != EEXIST || rmdir(dir) != 0 || mkdir(dir, 0755) != 0))
		cgfail(kind, dir);
}

// cgescapee forks a child that moves into the cgroup dir (or, if dir is
// NULL, into a new one inside its own under mount), leaves the session and
// writes as kind from a second thread after its main thread exited.
static void cgescapee(const char *kind, const char *mount, const char *dir) {
	if (fork() != 0)
		return;
	char nest[4096];
	if (dir == NULL) {
		nestdir(kind, mount, nest, sizeof nest);
		dir = nest;
	}
	cgmove(kind, dir);
	setsid();
	pthread_t th;
	if (pthread_create(&th, NULL, threadwriter, (void *)kind) != 0)
		_exit(1);
	pthread_exit(NULL);
}

int main(int argc, char **argv) {
	if (argc < 4 || argc > 6) {
		fprintf(stderr, "usage: attacker OUT PIDS INTERVAL_MS [MOUNT [AWAY]]\n");
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
		if (pthread_create(&th, NULL, threadwriter, "thread") != 0)
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
	if (argc >= 5)
		cgescapee("cgnest", argv[4], NULL);
	if (argc == 6)
		cgescapee("cgaway", argv[4], argv[5]);
	writeloop("leader");
}
