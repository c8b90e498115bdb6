/* procmem: this process's memory as the kernel counts it: its resident set now and at its peak
 * (VmRSS and VmHWM in /proc/self/status; getrusage's ru_maxrss where /proc cannot be read), the
 * reset of that peak, and its minor page faults. It reads the kernel's figures only; what the
 * executor allocated is pool.h's and arena.h's. */
#ifndef PX_EXEC_PROCMEM_H
#define PX_EXEC_PROCMEM_H

/* The peak resident set in bytes (VmHWM, else ru_maxrss); NAN when neither can be read. */
double procmem_peak_rss_bytes(void);
/* The resident set now in bytes (VmRSS); NAN when it cannot be read. */
double procmem_rss_bytes(void);
/* Start the peak again from the resident set now (writes 5 to /proc/self/clear_refs, Linux 4.0
 * on). Returns 0, or -errno when the kernel refused (the peak then still counts from the
 * process's start). */
int procmem_reset_peak(void);
/* Minor page faults since the process started (getrusage's ru_minflt); -1 when unknown. */
long long procmem_minor_faults(void);

#endif
