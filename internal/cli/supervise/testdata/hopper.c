// hopper: a process that keeps moving: every INTERVAL_US microseconds it
// appends a line to OUT, forks, and exits, the child leaving the session
// (setsid) and going on. A supervisor that looks for it in /proc once
// finds a process that is gone by the time it is signalled.
//
// It exits when OUT.stop exists, so a test can end a hopper that escaped
// its supervisor (the failure it looks for) without leaving it running.
//
// usage: hopper OUT INTERVAL_US
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: hopper OUT INTERVAL_US\n");
		return 2;
	}
	int interval = atoi(argv[2]);
	char stop[4096];
	snprintf(stop, sizeof stop, "%s.stop", argv[1]);
	if (fork() > 0)
		for (;;)
			pause(); // the leader stays
	for (;;) {
		if (access(stop, F_OK) == 0)
			_exit(0);
		FILE *f = fopen(argv[1], "a");
		if (f) {
			fprintf(f, "%d\n", getpid());
			fclose(f);
		}
		usleep(interval);
		pid_t pid = fork();
		if (pid != 0)
			_exit(pid < 0);
		setsid();
	}
}
