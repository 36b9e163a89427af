// mainexit: a process that escapes a naive supervisor. It forks; the
// child leaves the session (setsid), ignores SIGTERM, writes its pid to
// PIDFILE, starts a thread that appends "fence=$FENCED_FENCE" to OUT every
// INTERVAL_MS milliseconds for LIFE_MS milliseconds, and ends its main
// thread with pthread_exit, so /proc shows it as a zombie while it writes.
// The parent waits in pause() until killed.
//
// usage: mainexit OUT PIDFILE INTERVAL_MS LIFE_MS
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: mainexit OUT PIDFILE INTERVAL_MS LIFE_MS\n");
		return 2;
	}
	out = argv[1];
	interval_ms = atoi(argv[3]);
	life_ms = atoi(argv[4]);
	pid_t pid = fork();
	if (pid < 0)
		return 1;
	if (pid > 0) {
		for (;;)
			pause();
	}
	setsid();
	signal(SIGTERM, SIG_IGN);
	pthread_t th;
	if (pthread_create(&th, NULL, writer, NULL) != 0)
		return 1;
	FILE *p = fopen(argv[2], "w");
	if (!p)
		return 1;
	fprintf(p, "%d\n", getpid());
	fclose(p);
	pthread_exit(NULL);
}
