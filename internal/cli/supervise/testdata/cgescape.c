// cgescape: a process that leaves its supervisor's cgroup. It forks; the
// child ignores SIGTERM and moves itself into another cgroup by writing
// its pid into that cgroup's cgroup.procs: with TARGET "nested", into a
// cgroup "escape" it makes (mkdir) inside its own, as any process whose
// cgroup is delegated to it may; otherwise into the cgroup directory
// TARGET (another cgroup: the root, a sibling). Then it leaves the session
// (setsid), starts a thread that appends "fence=$FENCED_FENCE" to OUT
// every INTERVAL_MS milliseconds for LIFE_MS milliseconds, writes its pid
// to PIDFILE and ends its main thread with pthread_exit, so that
// cgroup.procs no longer lists it and /proc shows it as a zombie while it
// writes. The parent waits in pause() until killed. MOUNT is the cgroup2
// mount point. If the move fails, PIDFILE gets "error: ..." instead.
//
// usage: cgescape OUT PIDFILE INTERVAL_MS LIFE_MS MOUNT nested|TARGET
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *out;
static int interval_ms, life_ms;

static void *writer(void *arg) {
	const char *fence = getenv("FENCED_FENCE");
	for (int t = 0; t < life_ms; t += interval_ms) {
		FILE *f = fopen(out, "a");
		if (f) {
			fprintf(f, "fence=%s\n", fence ? fence : "");
			fclose(f);
		}
		usleep(interval_ms * 1000);
	}
	exit(0);
	return arg;
}

static void report(const char *pidfile, const char *what) {
	FILE *p = fopen(pidfile, "w");
	if (!p)
		exit(1);
	fprintf(p, "%s\n", what);
	fclose(p);
}

// fail writes "error: WHAT: strerror(errno)" to PIDFILE and exits.
static void fail(const char *pidfile, const char *what) {
	char msg[512];
	snprintf(msg, sizeof msg, "error: %s: %s", what, strerror(errno));
	report(pidfile, msg);
	exit(3);
}

// owncgroup writes this process's cgroup v2 directory under mount to dir.
static void owncgroup(const char *pidfile, const char *mount, char *dir, size_t n) {
	FILE *f = fopen("/proc/self/cgroup", "r");
	if (!f)
		fail(pidfile, "/proc/self/cgroup");
	char line[4096];
	while (fgets(line, sizeof line, f)) {
		if (strncmp(line, "0::", 3) == 0) {
			line[strcspn(line, "\n")] = 0;
			snprintf(dir, n, "%s%s", mount, line + 3);
			fclose(f);
			return;
		}
	}
	errno = ENOENT;
	fail(pidfile, "no 0:: line in /proc/self/cgroup");
}

int main(int argc, char **argv) {
	if (argc != 7) {
		fprintf(stderr, "usage: cgescape OUT PIDFILE INTERVAL_MS LIFE_MS MOUNT nested|TARGET\n");
		return 2;
	}
	out = argv[1];
	const char *pidfile = argv[2];
	interval_ms = atoi(argv[3]);
	life_ms = atoi(argv[4]);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid > 0) {
		for (;;)
			pause();
	}
	signal(SIGTERM, SIG_IGN);
	char target[4096];
	if (strcmp(argv[6], "nested") == 0) {
		char own[4000];
		owncgroup(pidfile, argv[5], own, sizeof own);
		snprintf(target, sizeof target, "%s/escape", own);
		if (mkdir(target, 0755) != 0 && errno != EEXIST)
			fail(pidfile, target);
	} else {
		snprintf(target, sizeof target, "%s", argv[6]);
	}
	char procs[4200], self[32];
	snprintf(procs, sizeof procs, "%s/cgroup.procs", target);
	snprintf(self, sizeof self, "%d", getpid());
	int fd = open(procs, O_WRONLY);
	if (fd < 0 || write(fd, self, strlen(self)) < 0)
		fail(pidfile, procs);
	close(fd);
	setsid();
	pthread_t th;
	if (pthread_create(&th, NULL, writer, NULL) != 0)
		return 1;
	report(pidfile, self);
	pthread_exit(NULL);
}
