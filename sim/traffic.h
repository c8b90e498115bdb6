/* traffic: what a schedule moves per optimizer step: collective payloads (nccl-tests' "size"
 * convention: the whole array, count x nranks x type size for gathers and scatters), the bytes each
 * rank sends under ring algorithms, host/NVMe copies and FLOPs. It does not time anything. */
#ifndef PX_SIM_TRAFFIC_H
#define PX_SIM_TRAFFIC_H

#include "../engine/schedule.h"

typedef struct Traffic {
	double payload_bytes[N_COLLS];
	double wire_bytes[N_COLLS];     /* sent by one rank */
	double group_payload_bytes[N_GROUPS];
	long long n_colls[N_COLLS];
	double wire_total_bytes;
	double copy_bytes[N_COPIES];
	double flops[N_COMPS];
	double flops_total;
} Traffic;

/* Bytes one rank sends for a collective of `payload` bytes over n ranks with ring algorithms:
 * all-reduce 2(n-1)/n, reduce-scatter, all-gather and all-to-all (n-1)/n, broadcast and
 * point-to-point 1 (nccl-tests doc/PERFORMANCE.md bus-bandwidth factors). */
double traffic_ring_wire_bytes(CollKind kind, double payload, int n);

/* Payload of every collective kind together. */
double traffic_payload_total(const Traffic *t);

/* Sum one step (set-up excluded; micro-batch loops multiplied out). */
int sim_traffic(const Schedule *s, Traffic *t, PxError *err);

#endif
