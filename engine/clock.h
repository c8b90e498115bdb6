/* clock: the one monotonic clock every timer of the project reads (CLOCK_MONOTONIC, in seconds),
 * for durations only: its zero is arbitrary. */
#ifndef PX_CLOCK_H
#define PX_CLOCK_H

/* Seconds on the monotonic clock. */
double px_now_s(void);

#endif
